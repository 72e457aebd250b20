"""`dspark bench --peer`: ours beside llama.cpp's llama-bench. llama.cpp is not built here, so a
stand-in script answers as llama-bench does (its JSON records), and crashes on repacked weights as
the real one does on some VMs; our side is the real engine on the default model."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dspark_cli.bench import peer

# Answers like `llama-bench -o json`: one record with tokens/s that encode the test it was asked for,
# so the report can be checked against the arguments. `--repack 1` dies with SIGILL's exit status.
STAND_IN = textwrap.dedent('''\
    import json, sys
    args = sys.argv[1:]
    value = lambda flag: args[args.index(flag) + 1]
    with open(sys.argv[0] + ".calls", "a") as log:
        log.write(json.dumps(args) + "\\n")
    if value("--repack") == "1":
        sys.exit(132)
    n_prompt, n_gen, threads = int(value("-p")), int(value("-n")), int(value("-t"))
    rate = 100.0 * threads if n_gen else 1000.0 * threads
    print(json.dumps([{"build_commit": "standin", "build_number": 1, "cpu_info": "test", "n_prompt": n_prompt,
                       "n_gen": n_gen, "n_depth": int(value("-d")) if "-d" in args else 0, "n_threads": threads,
                       "avg_ts": rate, "samples_ts": [rate] * int(value("-r"))}]))
''')


@pytest.fixture
def stand_in(tmp_path) -> Path:
    path = tmp_path / "llama-bench"
    path.write_text(f"#!{sys.executable}\n{STAND_IN}")
    path.chmod(0o755)
    return path


def _calls(path: Path) -> list[list[str]]:
    return [json.loads(line) for line in Path(f"{path}.calls").read_text().splitlines()]


def test_a_repacked_crash_falls_back_for_that_test_and_is_reported(stand_in, tmp_path):
    """Each test tries repacked weights first and, where they crash, reruns with --repack 0; the note
    names the failure, and the run says which setting it used."""
    p = peer.Peer(stand_in, tmp_path / "model.gguf", repeats=2)
    first = p.run(2, ["-p", "0", "-n", "16", "-d", "40"])
    second = p.run(1, ["-p", "64", "-n", "0"])
    assert (first.tokens_per_s, first.repack, second.tokens_per_s, second.repack) == (200.0, False, 1000.0, False)
    repacks = [c[c.index("--repack") + 1] for c in _calls(stand_in)]
    assert repacks == ["1", "0", "1", "0"]
    assert len(p.notes) == 2 and all("--repack 0" in n and "132" in n for n in p.notes)


def test_a_failing_peer_is_an_error_not_a_number(tmp_path):
    """A llama-bench that fails without repacking raises with its own message."""
    broken = tmp_path / "llama-bench"
    broken.write_text(f"#!{sys.executable}\nimport sys\nprint('no such model', file=sys.stderr)\nsys.exit(1)\n")
    broken.chmod(0o755)
    with pytest.raises(RuntimeError, match="no such model"):
        peer.Peer(broken, tmp_path / "model.gguf", repeats=1).run(1, ["-p", "8", "-n", "0"])


def test_peer_bench_end_to_end(stand_in, tmp_path, default_model_dir):
    """`dspark bench --peer` on the default model: decode and prefill rows per thread count, each our
    measured rate beside the peer's, with the ratio; the peer was asked for the same token counts and a
    context as long as our prompt."""
    out = tmp_path / "report"
    subprocess.run([sys.executable, "-m", "dspark_cli.main", "bench", "--peer", str(stand_in), "--peer-threads", "1",
                    "--peer-prefill", "48", "--max-tokens", "8", "--repeats", "1", "--out", str(out)],
                   check=True, capture_output=True, text=True, timeout=600)
    rep = json.loads((out / "report.json").read_text())
    decode, prefill = rep["rows"]
    assert (decode["test"], prefill["test"], decode["threads"]) == ("decode", "prefill", 1)
    assert decode["peer_tokens_per_s"] == 100.0 and prefill["peer_tokens_per_s"] == 1000.0
    for row in rep["rows"]:
        assert row["ours_tokens_per_s"] > 0 and row["ratio"] == pytest.approx(
            row["ours_tokens_per_s"] / row["peer_tokens_per_s"], rel=1e-2)
    assert decode["decoded_tokens"] == 7  # 8 tokens: the first comes from the prefill
    calls = _calls(stand_in)
    gen = next(c for c in calls if c[c.index("-n") + 1] == "8")
    assert gen[gen.index("-d") + 1] == str(decode["prompt_tokens"])
    assert all(row["peer_repack"] is False for row in rep["rows"]) and len(rep["notes"]) == 2
    assert "| decode | 1 |" in (out / "report.md").read_text() and "--repack 0" in (out / "report.md").read_text()
