"""The copy-heavy bench pieces (issue 24, part 5): the workload set, the looping measure, the
per-workload rows and table, lookup as a benchable mode, and the server arm's request and record.

No speed is asserted: ratios are checked as the quotients of the runs they pair.
"""

from __future__ import annotations

import json
import statistics

import httpx
import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer

from dspark_cli.bench import SPEC_MODES, _plan, core, report, runner, workloads
from dspark_cli.bench.arms import Arm
from dspark_cli.bench.plan import BenchPlan
from dspark_cli.bench.prompts import DEFAULT_WORKLOADS, load_prompts
from dspark_cli.bench.server import ServerArm, server_arms
from dspark_cli.main import build_parser
from engine import costs
from engine.api import MODES, EngineInfo, SpecConfig
from engine.lookup import LookupConfig, LookupDrafter
from engine.runtime import Runtime
from tests.engine import tiny

KINDS = ["code_edit", "quote_qa", "rewrite", "revision", "chat"]


def test_workload_set_has_every_kind_and_its_shape():
    """workloads-v1: 8 prompts of each of the five kinds, ending in a user turn; revisions have two turns."""
    prompts, meta = load_prompts(DEFAULT_WORKLOADS)
    assert meta["file"] == "workloads-v1.jsonl" and meta["kinds"] == sorted(KINDS) and meta["count"] == 40
    assert [p.kind for p in prompts[:5]] == KINDS  # kinds interleaved, in file order
    assert len({p.id for p in prompts}) == 40
    for p in prompts:
        assert p.messages[-1]["role"] == "user" and p.messages[-1]["content"].strip()
        roles = [m["role"] for m in p.messages]
        assert roles == (["user", "assistant", "user"] if p.kind == "revision" else ["user"])
    edits = [p for p in prompts if p.kind == "code_edit"]
    assert all("```python\n" in p.messages[0]["content"] and "Rename the variable" in p.messages[0]["content"]
               for p in edits)
    revisions = [p for p in prompts if p.kind == "revision"]
    assert all(p.messages[2]["content"].startswith("Revise your last answer") for p in revisions)
    assert len(load_prompts(DEFAULT_WORKLOADS, per_kind=2)[0]) == 10


def test_looping_measure_classifies_a_loop_and_a_copy():
    """A phrase repeated over and over is looping; a long output with no inner repetition is not,
    even when it is a verbatim copy of something else (copying from the prompt is not looping)."""
    phrase = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]
    loop = [1, 2, 3] + phrase * 6
    share = workloads.repeated_ngram_share(loop)
    assert share > workloads.LOOP_THRESHOLD and workloads.is_looping(share)
    copied_function = list(range(100, 228))  # 128 distinct tokens: no 8-gram occurs twice
    assert workloads.repeated_ngram_share(copied_function) == 0.0
    assert not workloads.is_looping(workloads.repeated_ngram_share(copied_function))
    # One repeated idiom in an otherwise varied output stays well under the threshold.
    idiom = [7, 7, 8, 9, 10, 11, 12, 13, 14]
    varied = idiom + list(range(300, 360)) + idiom + list(range(400, 460))
    assert 0.0 < workloads.repeated_ngram_share(varied) < workloads.LOOP_THRESHOLD
    assert workloads.repeated_ngram_share([1, 2, 3]) == 0.0


def _run(block, prompt, arm, wall, *, share=0.0, rounds=10, matched=6, empty=4, drafted=20, accepted=15,
         same=True, cpu=None, decode=None):
    return {"block": block, "prompt": prompt, "pass": 0, "arm": arm, "mode": arm.split("@")[0], "cap": None,
            "tokens": 100, "wall_s": wall, "decode_s": wall if decode is None else decode, "decode_tokens": 99, "rounds": rounds,
            "drafted": drafted, "accepted": accepted, "same_as_baseline": same, "repeat_share": share,
            "cpu_s": cpu, "by_kind": {"lookup": {"rounds": matched, "empty_rounds": empty,
                                                 "drafted_tokens": drafted, "accepted_tokens": accepted}}}


def _records():
    # Prompts a1, a2 (kind "edit"; a2's output loops) and b1 (kind "chat"), one block each.
    # Decode (after the first token) takes 3 of the baseline's 4 s: decode speedups x3 and x6.
    return [_run(0, "a1", "baseline", 4.0, cpu=4.0, decode=3.0), _run(0, "a1", "lookup@auto", 2.0, cpu=1.0, decode=1.0),
            _run(1, "a2", "baseline", 4.0, share=0.9, cpu=4.0, decode=3.0),
            _run(1, "a2", "lookup@auto", 1.0, cpu=1.0, decode=0.5),
            _run(2, "b1", "baseline", 3.0), _run(2, "b1", "lookup@auto", 3.0, matched=1, empty=9, same=False)]


def test_workload_rows_split_looping_and_count_lookup():
    """Per kind: median speedup over prompts, split by the baseline output's loop share; tau, match
    fraction (matched / attempted rounds), acceptance (accepted / drafted) and identity."""
    kinds = {"a1": "edit", "a2": "edit", "b1": "chat"}
    w = workloads.summarize_workloads(_records(), kinds, ["baseline", "lookup@auto"])
    rows = {r["kind"]: r for r in w["rows"]}
    assert list(rows) == ["edit", "chat", "all"] and w["loop_share"] == {"a1": 0.0, "a2": 0.9, "b1": 0.0}
    edit = rows["edit"]
    assert (edit["prompts"], edit["looping_prompts"]) == (2, 1)
    assert edit["speedup"] == statistics.median([2.0, 4.0])
    assert (edit["speedup_non_looping"], edit["speedup_looping"], edit["speedup_min"]) == (2.0, 4.0, 2.0)
    assert edit["decode_speedup"] == 4.5 and edit["decode_speedup_non_looping"] == 3.0
    assert edit["cpu_speedup"] == 4.0 and edit["cpu_speedup_non_looping"] == 4.0
    assert edit["tau"] == pytest.approx(99 / 10) and edit["acceptance"] == 0.75
    assert edit["match_fraction"] == 0.6 and edit["same_output"] == 1.0
    chat = rows["chat"]
    assert chat["speedup"] == 1.0 and chat["speedup_looping"] is None and chat["cpu_speedup"] is None
    assert chat["match_fraction"] == 0.1 and chat["same_output"] == 0.0
    assert rows["all"]["prompts"] == 3 and rows["all"]["same_output"] == pytest.approx(2 / 3, abs=1e-4)


def test_workload_table_columns(tmp_path):
    """report.md carries the per-workload table with its fixed columns, one line per row."""
    kinds = {"a1": "edit", "a2": "edit", "b1": "chat"}
    arms = [Arm("baseline", "baseline", None, None), Arm("lookup@auto", "lookup", "auto", None)]
    summ = core.summarize(_records(), arms, {}, kinds)
    env = {"device": "cpu", "platform": "test", "cores": 1, "mlx": "x", "blas": "test", "sgemm_gflops": 1.0}
    rep = core.build_report(_records(), summ, {}, plan=BenchPlan(modes=("lookup",)), environment=env,
                            prompt_meta={"file": "t", "sha256": "0" * 64, "count": 3}, target="tiny",
                            command="dspark bench", skipped=[])
    md = report.write_markdown(rep, tmp_path).read_text()
    header = "| " + " | ".join(report.WORKLOAD_COLUMNS) + " |"
    assert header in md and "speedup all" in header and "non-looping" in header and "match fraction" in header
    table = md.split(header)[1].split("\n\n")[0].strip().splitlines()[1:]
    assert [line.split(" | ")[0] for line in table] == ["| edit", "| chat", "| all"]
    assert "| edit | lookup@auto | 2 | 1 | x3.00 | x2.00 | x4.00 | x2.00 | x4.50 | x3.00 | x4.00 | x4.00 | 9.90 | 0.60 | 0.75 | 100% |" in md


def test_runner_compares_text_and_records_loop_share():
    """Server arms return text as well as ids: both must match the baseline's for `same_as_baseline`."""
    records = [{"block": 0, "arm": "baseline", "ids": [1, 2], "text": "ab"},
               {"block": 0, "arm": "lookup@auto", "ids": [1, 2], "text": "ab"},
               {"block": 1, "arm": "baseline", "ids": [1, 2], "text": "ab"},
               {"block": 1, "arm": "lookup@auto", "ids": [1, 2], "text": "a b"}]
    runner._mark_same_output(records)
    assert [r["same_as_baseline"] for r in records] == [True, True, True, False]
    assert all("ids" not in r and "text" not in r and r["repeat_share"] == 0.0 for r in records)


def test_benchable_modes_come_from_the_engine():
    """--modes takes every engine mode with a drafter (lookup included), not baseline or auto;
    --caps auto times auto alone; --server times auto only and refuses fixed caps."""
    assert "lookup" in SPEC_MODES and set(SPEC_MODES) == set(MODES) - {"baseline", "auto"}
    parse = build_parser().parse_args
    plan = _plan(parse(["bench", "--modes", "lookup", "--caps", "auto"]))
    assert plan.modes == ("lookup",) and plan.caps_for(8) == []
    served = _plan(parse(["bench", "--server", "--workloads", "--modes", "lookup"]))
    assert served.caps == () and served.mlx_lm is False
    for bad in (["--modes", "auto"], ["--modes", "baseline"], ["--server", "--caps", "2"]):
        with pytest.raises(SystemExit):
            _plan(parse(["bench", *bad]))


def test_in_process_lookup_arm(default_model_dir):
    """`lookup` benches in-process like a trained drafter: auto only with --caps auto, lossless,
    and its runs carry the lookup kind's matched and empty rounds."""
    tok = load_tokenizer(default_model_dir)
    target, drafter = tiny.tiny_target(), LookupDrafter(LookupConfig())
    curve = costs.measure_curve(target, drafter, drafter.config.max_drafts)

    def runtime(mode, d, c):
        info = EngineInfo(model_id="tiny", model_path="-", mode=mode, drafter=None, cap=4 if d else None,
                          context_length=256, sampler="rejection")
        return Runtime(target=target, drafter=d, tokenizer=tok, info=info, eos_ids=frozenset(),
                       spec=SpecConfig(mode=mode, max_draft="auto"), curve=c, cap=4 if d else None)

    plan = BenchPlan(modes=("lookup",), caps=(), max_tokens=12, repeats=1, mlx_lm=False, warmup_tokens=2)
    prompts = [("p", [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7])]
    records, summ, arms = core.measure(runtime("baseline", None, None), {"lookup": runtime("lookup", drafter, curve)},
                                       prompts, plan, kinds={"p": "copy"})
    assert [a.name for a in arms] == ["baseline", "lookup@auto"]
    assert all(r["same_as_baseline"] for r in records)
    look = next(r for r in records if r["arm"] == "lookup@auto")
    assert set(look["by_kind"]) <= {"lookup"} and json.dumps(look)
    assert [r["kind"] for r in summ["workloads"]["rows"]] == ["copy", "all"]


class _FakeTokenizer:
    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


def test_server_arm_request_and_record():
    """A server arm sends one greedy non-streaming chat request and turns the reply into a run record."""
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["path"], seen["body"] = request.url.path, json.loads(request.content)
        stats = {"rounds": 5, "mean_accepted_length": 2.0, "drafted_tokens": 8, "accepted_tokens": 5,
                 "time_prefill_s": 0.1, "time_draft_s": 0.01, "time_verify_s": 0.2, "time_accept_s": 0.01,
                 "time_other_s": 0.0, "by_kind": {"lookup": {"rounds": 4, "empty_rounds": 1}}}
        return httpx.Response(200, json={"choices": [{"message": {"content": "hello"}, "finish_reason": "length"}],
                                         "usage": {"prompt_tokens": 30, "completion_tokens": 11},
                                         "dspark_stats": stats})

    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        arm = ServerArm("lookup@auto", "lookup", "auto", "http://test", client, _FakeTokenizer())
        run = arm.run(({"role": "user", "content": "hi"},), 11)
    assert seen["path"] == "/v1/chat/completions"
    assert seen["body"]["temperature"] == 0 and seen["body"]["max_tokens"] == 11 and "stream" not in seen["body"]
    assert run["text"] == "hello" and run["ids"] == [ord(c) for c in "hello"]
    assert (run["tokens"], run["prompt_tokens"], run["decode_tokens"], run["rounds"]) == (11, 30, 10, 5)
    assert run["decode_s"] == pytest.approx(0.22) and run["by_kind"]["lookup"]["empty_rounds"] == 1
    assert run["cpu_s"] is None  # no server process to charge


class _Server:
    def __init__(self, mode):
        self.mode, self.base_url = mode, f"http://{mode}"
        self.proc = type("P", (), {"pid": None})()


def test_server_arms_skip_a_mode_the_server_does_not_run():
    """A server that fell back to another mode (e.g. dspark with no drafter) is noted, not timed."""
    servers = [_Server("baseline"), _Server("lookup"), _Server("dspark")]
    health = {"baseline": {"mode": "baseline"}, "lookup": {"mode": "lookup"},
              "dspark": {"mode": "baseline", "mode_note": "no drafter known"}}
    arms, skipped = server_arms(servers, health, client=None, tokenizer=None)
    assert [a.name for a in arms] == ["baseline", "lookup@auto"]
    assert skipped == ["dspark: the server runs baseline (no drafter known)"]
