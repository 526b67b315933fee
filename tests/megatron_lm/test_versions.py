"""Why the glue accepts megatron-core 0.19.1 (Megatron-LM core_r0.19.0) and 0.19.2 (the wheel):
their code differs in five files only, none of which holds a seam the glue uses; in
transformer_layer.py the objects the spec rewrite uses are unchanged. (The version guard's
accept/refuse cases are in tests/megatron/test_mcore_spec_policy.py.)"""

import ast
import filecmp
from pathlib import Path

from conftest import CHECKOUT, NEEDS_CHECKOUT, WHEEL

DIFFERING = {  # megatron/ files that differ between f8837c04ef and the 0.19.2 wheel
    "core/package_info.py",  # the version
    "core/transformer/transformer_layer.py",  # get_inner_quantization_context (FP8/FP4)
    "core/transformer/multi_token_prediction.py",
    "core/models/common/model_chunk_schedule_plan.py",
    "core/inference/text_generation_server/dynamic_text_gen_server/endpoints/chat_completions.py",
}


def _python_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*.py") if "__pycache__" not in p.parts}


@NEEDS_CHECKOUT
def test_checkout_and_wheel_differ_only_outside_the_seams():
    ours, wheel = CHECKOUT / "megatron", WHEEL / "megatron"
    common = _python_files(ours) & _python_files(wheel)
    assert "core/tensor_parallel/layers.py" in common and len(common) > 500
    differ = {f for f in common if not filecmp.cmp(ours / f, wheel / f, shallow=False)}
    assert differ == DIFFERING


def _source_of(path: Path, name: str) -> str:
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if getattr(n, "name", None) == name)
    return ast.unparse(node)


@NEEDS_CHECKOUT
def test_transformer_layer_objects_the_rewrite_uses_are_unchanged():
    rel = Path("megatron/core/transformer/transformer_layer.py")
    for name in ("get_transformer_layer_offset", "TransformerLayerSubmodules"):
        assert _source_of(CHECKOUT / rel, name) == _source_of(WHEEL / rel, name)
