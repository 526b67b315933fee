"""python -m ufp4_megatron.bench's own handling: each suite's tables between that suite's
markers in --out (the rest of the file kept), and an --out or --json that cannot be written
refused in one line before anything runs. The suites run their real code paths here, at a
small shape with a stand-in timer (the CUDA check is faked: the rows run where the tests do)."""

import pytest
import torch

from ufp4_megatron.bench import __main__ as bench
from ufp4_megatron.bench import amax, formats

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PAGE = """# Performance

intro
<!-- bench-formats:begin -->
old formats
<!-- bench-formats:end -->
between
<!-- bench-amax:begin -->
old amax
<!-- bench-amax:end -->
end
"""


@pytest.fixture
def suites(monkeypatch):
    """The formats and amax suites on this machine, at a small shape; the calls made."""
    ran = []

    def timer(fn, inputs):
        fn(inputs[0])
        return 1.0

    def format_rows(log):
        ran.append("formats")
        return real_formats(log=log, shape=(32, 48), recipes=("nvfp4",), device=DEVICE, timer=timer)

    def amax_rows(log):
        ran.append("amax")
        return real_amax(log=log, shapes=((32, 48),), device=DEVICE, timer=timer)

    real_formats, real_amax = formats.format_rows, amax.amax_rows
    monkeypatch.setattr(formats, "format_rows", format_rows)
    monkeypatch.setattr(amax, "amax_rows", amax_rows)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "a stand-in GPU")
    return ran


def test_each_suite_writes_between_its_own_markers(suites, tmp_path, capsys):
    page, raw = tmp_path / "performance.md", tmp_path / "raw.json"
    page.write_text(PAGE)
    bench.main(["--suite", "formats,amax", "--out", str(page), "--json", str(raw)])
    assert suites == ["formats", "amax"]
    text = page.read_text()
    fmt_block = text.split("<!-- bench-formats:begin -->")[1].split("<!-- bench-formats:end -->")[0]
    amax_block = text.split("<!-- bench-amax:begin -->")[1].split("<!-- bench-amax:end -->")[0]
    assert "### Each recipe's operands" in fmt_block and "NVFP4 tensor amax" not in fmt_block
    assert "### NVFP4 tensor amax" in amax_block and "recipe's operands" not in amax_block
    assert "a stand-in GPU" in fmt_block and "a stand-in GPU" in amax_block
    assert "old" not in text
    for kept in ("# Performance\n\nintro\n", "\nbetween\n", "\nend\n"):
        assert kept in text
    assert '"amax"' in raw.read_text() and '"formats"' in raw.read_text()


def test_the_kernel_and_layer_suites_each_keep_the_others_table(suites, tmp_path, monkeypatch):
    from ufp4_megatron.bench import kernels, layer

    krow = dict(shape=(32, 48), what="copy (roofline)", ms=1.0, tbs=1.0, pct=100.0)
    lrow = dict(layer="fc1", k=32, n=48, recipe="ufp4", ms=1.0, ratio=1.0, mem=1.0, mem_ratio=1.0)
    monkeypatch.setattr(kernels, "kernel_rows", lambda compile_shapes, log: [krow])
    monkeypatch.setattr(layer, "layer_rows", lambda log: [lrow])
    page = tmp_path / "performance.md"
    page.write_text(
        "<!-- bench:begin -->\nold kernels\n<!-- bench:end -->\n"
        "<!-- bench-layer:begin -->\nold layer\n<!-- bench-layer:end -->\n"
    )

    def blocks():
        kernel_block, layer_block = page.read_text().split("<!-- bench:end -->")
        return kernel_block, layer_block

    bench.main(["--suite", "layer", "--out", str(page)])
    kernel_block, layer_block = blocks()
    assert "\nold kernels\n" in kernel_block and "| fc1 | 32x48 | ufp4 |" in layer_block
    bench.main(["--suite", "kernels", "--out", str(page)])
    kernel_block, layer_block = blocks()
    assert "| 32x48 | copy (roofline) |" in kernel_block and "old kernels" not in kernel_block
    assert "| fc1 | 32x48 | ufp4 |" in layer_block


@pytest.mark.parametrize(
    "where, says",
    [
        ("missing/performance.md", "does not exist; create it first"),
        (".", "is a directory; give a file"),
    ],
)
@pytest.mark.parametrize("flag", ["--out", "--json"])
def test_an_unwritable_output_is_refused_before_the_run(suites, tmp_path, flag, where, says):
    with pytest.raises(SystemExit) as e:
        bench.main(["--suite", "amax", flag, str(tmp_path / where)])
    assert flag in str(e.value) and says in str(e.value)
    assert suites == []  # nothing ran


@pytest.mark.parametrize(
    "args, says",
    [
        (["--steps", "0"], "give steps >= 1 and 0 <= skip < steps"),
        (["--steps", "12", "--skip", "12"], "give steps >= 1 and 0 <= skip < steps"),
        (["--skip", "-1"], "give steps >= 1 and 0 <= skip < steps"),
        (["--timeout", "0"], "--timeout 0: give 30 seconds or more"),
        (["--deadline", "-5"], "--deadline -5.0: give 30 seconds or more"),
        (["--set", "train.seq_len"], "--set 'train.seq_len': give KEY=VALUE"),
    ],
)
def test_step_options_that_would_time_nothing_are_refused_first(suites, args, says):
    """A skip past the last step would leave every row's median empty (NaN), a timeout or
    deadline under 30 s would start no run, an override without '=' would fail every run:
    refused before the suite, in one line."""
    with pytest.raises(SystemExit) as e:
        bench.main(["--suite", "step", *args])
    assert says in str(e.value)
