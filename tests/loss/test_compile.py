"""Inside torch.compile the loss is one opaque custom op: the same loss, metrics and gradients as eager."""

import pytest
import torch
import torch._dynamo.testing

import orpo_lib
from orpo_lib import fused
from conftest import make_problem

METRICS = ("loss", "nll_loss", "or_loss", "chosen_logps", "rejected_logps", "log_odds_ratio", "log_odds_chosen",
           "reward_accuracy", "reward_margin", "chosen_logits_mean", "rejected_logits_mean")


def loss_and_metrics(hidden, weight, target, bias, nll_target, chunk_size):
    out = orpo_lib.fused_linear_orpo_loss(hidden, weight, target, bias, nll_target=nll_target, beta=0.2,
                                          chunk_size=chunk_size)
    return tuple(getattr(out, name) for name in METRICS)


def run(fn, problem, chunk_size):
    leaves = [problem[k].clone().requires_grad_() for k in ("hidden", "weight", "bias")]
    values = fn(leaves[0], leaves[1], problem["target"], leaves[2], problem["nll_target"], chunk_size)
    values[0].backward()
    return values, [leaf.grad for leaf in leaves]


@pytest.mark.parametrize("fullgraph", [False, True])
@pytest.mark.parametrize("chunk_size", [None, 5])  # one block, and several chunks with two-pass pairs
def test_compiled_equals_eager(fullgraph, chunk_size):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(loss_and_metrics, fullgraph=fullgraph)
    for seq in (7, 9, 12):  # new sequence lengths: one recompilation to dynamic shapes, then none
        problem = make_problem(4, seq, 48, 517, with_bias=True, with_nll_target=True, seed=seq)
        eager_values, eager_grads = run(loss_and_metrics, problem, chunk_size)
        values, grads = run(compiled, problem, chunk_size)
        assert torch.equal(values[0], eager_values[0])  # the loss, from the custom op: bitwise
        for name, a, b in zip(METRICS[1:], values[1:], eager_values[1:]):  # formed by code the compiler may fuse
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=name)
        for a, b in zip(grads, eager_grads):
            assert torch.equal(a, b)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] <= 2


@pytest.mark.parametrize("chunk_size", [None, 5])  # one block (which saves nothing), and several chunks
def test_compiled_without_gradients_equals_eager(chunk_size):
    torch._dynamo.reset()
    compiled = torch.compile(loss_and_metrics, fullgraph=True)
    problem = make_problem(4, 7, 48, 517, with_bias=True, with_nll_target=True, seed=5)
    args = (problem["hidden"], problem["weight"], problem["target"], problem["bias"], problem["nll_target"], chunk_size)
    with torch.no_grad():
        eager, values = loss_and_metrics(*args), compiled(*args)
    assert torch.equal(values[0], eager[0])
    for name, a, b in zip(METRICS[1:], values[1:], eager[1:]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=name)


def test_compiled_bad_labels_still_raise():
    torch._dynamo.reset()
    problem = make_problem(4, 7, 48, 517)
    problem["target"][1, 2] = 517
    compiled = torch.compile(loss_and_metrics, fullgraph=True)
    with pytest.raises(ValueError, match="target holds 1 token id"):
        compiled(problem["hidden"], problem["weight"], problem["target"], None, None, None)


@pytest.mark.parametrize("chunk_size", [None, 5])
def test_compiled_graphs_call_the_custom_ops(chunk_size):
    """The compiled forward and backward graphs each hold their custom op, and nothing of the Triton launches."""
    torch._dynamo.reset()
    backend = torch._dynamo.testing.AotEagerAndRecordGraphs()
    compiled = torch.compile(loss_and_metrics, backend=backend, fullgraph=True)
    run(compiled, make_problem(4, 7, 48, 517, with_bias=True, seed=3), chunk_size)
    ops = torch.ops.orpo_lib
    (forward,), (backward,) = backend.fw_graphs, backend.bw_graphs
    forward_targets = {node.target for node in forward.graph.nodes if node.op == "call_function"}
    backward_targets = {node.target for node in backward.graph.nodes if node.op == "call_function"}
    assert getattr(ops, fused.FORWARD_OP).default in forward_targets
    assert getattr(ops, fused.BACKWARD_OP).default in backward_targets
    assert torch.ops.aten.mm.default not in forward_targets | backward_targets  # no GEMM of the chunk loop traced


@pytest.mark.parametrize("chunk_size", [None, 5])
def test_fake_tensors_meet_the_fake_implementation(chunk_size):
    """Under FakeTensorMode (shape inference, meta-device tools) the loss runs its fake implementation. A single
    block's saved gradient has as many rows as the labels keep, a size only a shape environment can stand for."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    problem = make_problem(4, 7, 48, 517)
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        hidden, weight, target = (mode.from_tensor(problem[k]) for k in ("hidden", "weight", "target"))
        out = orpo_lib.fused_linear_orpo_loss(hidden.requires_grad_(), weight.requires_grad_(), target,
                                              chunk_size=chunk_size)
        out.loss.backward()
        assert out.loss.shape == () and out.chosen_logps.shape == (2,)
        assert hidden.grad.shape == hidden.shape and weight.grad.shape == weight.shape


def test_the_ops_pass_opcheck():
    """Schema, fake implementation and AOT dispatch of both ops, as torch.library checks them."""
    problem = make_problem(4, 7, 48, 517, with_bias=True)
    args = (problem["hidden"], problem["weight"], problem["bias"], problem["target"], None, 0.1, -100, True, None,
            True, True, True, True, False)  # several blocks: the saved state has static shapes
    forward_op, backward_op = (getattr(torch.ops.orpo_lib, name) for name in (fused.FORWARD_OP, fused.BACKWARD_OP))
    checks = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(forward_op, args, test_utils=checks)
    out = forward_op(*args)
    backward_args = (torch.tensor(0.5), problem["hidden"], problem["weight"], *out[3:], True, True, True, False)
    torch.library.opcheck(backward_op, backward_args, test_utils=checks)
    # without gradients a single block saves nothing: the fake implementation must agree
    no_grad_args = (*args[:10], False, False, False, True)
    torch.library.opcheck(forward_op, no_grad_args, test_utils=("test_schema", "test_faketensor"))
    assert all(t.numel() == 0 for t in forward_op(*no_grad_args)[3:])


# What the ops of OPS_VERSION return at (4, 7, 48) bf16 inputs and V = 517 (rows padded to 528), several blocks
# then one block, with every gradient: forward's loss, metrics, sequence log-probs, dX, dW, dbias sums, a single
# block's G and its row tokens ("u": a size the labels decide); then backward's dX, dW, dbias from those.
OP_SHAPES = {2: [
    [((), "float32"), ((12,), "float32"), ((4,), "float32"), ((28, 48), "bfloat16"), ((528, 48), "float32"),
     ((517,), "float32"), ((0,), "bfloat16"), ((0,), "int64")],
    [((4, 7, 48), "bfloat16"), ((517, 48), "bfloat16"), ((517,), "bfloat16")],
    [((), "float32"), ((12,), "float32"), ((4,), "float32"), ((0,), "bfloat16"), ((0,), "bfloat16"),
     ((0,), "bfloat16"), (("u", 528), "bfloat16"), (("u",), "int64")],
    [((4, 7, 48), "bfloat16"), ((517, 48), "bfloat16"), ((517,), "bfloat16")],
]}


def test_a_change_to_what_the_ops_return_changes_their_names():
    """A compiled graph cached on disk holds the shapes its ops returned, under the ops' names: a fake
    implementation that returns other shapes must come with a new ``fused.OPS_VERSION``, and its shapes here."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    problem = make_problem(4, 7, 48, 517, with_bias=True, dtype=torch.bfloat16)
    forward_op, backward_op = (getattr(torch.ops.orpo_lib, name) for name in (fused.FORWARD_OP, fused.BACKWARD_OP))
    shapes = lambda out: [(tuple(d if isinstance(d, int) else "u" for d in t.shape), str(t.dtype)[6:]) for t in out]
    returned = []
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        hidden, weight, bias, target = (mode.from_tensor(problem[k], static_shapes=True)
                                         for k in ("hidden", "weight", "bias", "target"))
        for single_block in (False, True):
            out = forward_op(hidden, weight, bias, target, None, 0.1, -100, True, None, True, True, True, True,
                             single_block)
            grads = backward_op(torch.ones((), dtype=torch.float32), hidden, weight, *out[3:], True, True, True,
                                single_block)
            returned += [shapes(out), shapes(grads)]
    assert returned == OP_SHAPES[fused.OPS_VERSION]
