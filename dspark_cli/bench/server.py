"""`dspark bench --server`: the paired bench through running servers, as a client sees them.

One `dspark serve` child process per arm (baseline, and each speculative mode at its default
`--max-draft auto`), each on its own loopback port. Every prompt goes to every server as the same
non-streaming chat request (temperature 0, fixed max_tokens), in the interleaved block order of
`runner`, so the ratios are paired exactly as in the in-process bench. Times are end to end: from
sending the request to having parsed the whole response. Outputs are compared as text.

The servers run one at a time (each waits idle while another answers), so they do not compete for
the CPU; they inherit this process's CPU affinity and environment (BLAS threads included).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

BASELINE = "baseline"


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) the process has used so far, from /proc (Linux)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    # After the command name: state is field 3, utime and stime are fields 14 and 15 (in clock ticks).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env() -> dict[str, str]:
    """This environment without DSPARK_* settings (which would override the flags given), offline."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSPARK_") or k == "DSPARK_CACHE"}
    # The bench never downloads: a model not on disk is an error, not a silent wait on the network.
    env["HF_HUB_OFFLINE"] = "1"
    return env


class ServerProcess:
    """`dspark serve --mode MODE` in a child process on a free loopback port; output kept for errors."""

    def __init__(self, mode: str, model: str | None, extra: tuple[str, ...] = ()):
        self.mode = mode
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "dspark_cli.main", "serve", "--host", "127.0.0.1", "--port", str(self.port),
               "--mode", mode, *(["--model", model] if model else []), *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=child_env())
        self.output: list[str] = []
        threading.Thread(target=self._collect, daemon=True).start()

    def _collect(self) -> None:
        for line in self.proc.stdout:
            self.output.append(line)

    def wait_ready(self, client, timeout: float) -> dict:
        """Poll /health until the model is loaded; its body. Raises with the server's output otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dspark serve --mode {self.mode} exited:\n" + "".join(self.output[-40:]))
            try:
                r = client.get(f"{self.base_url}/health", timeout=5)
                if r.status_code == 200:
                    return r.json()
            except Exception:  # not listening yet (connection refused, reset while starting)
                pass
            time.sleep(0.5)
        raise RuntimeError(f"dspark serve --mode {self.mode} not ready after {timeout:.0f} s:\n"
                           + "".join(self.output[-40:]))

    def stop(self) -> None:
        """Terminate the child (SIGTERM, then SIGKILL after 20 s)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@dataclass
class ServerArm:
    """A bench arm that is a running server: `run` sends one greedy chat request and times it."""

    name: str  # "baseline" or "<mode>@auto"
    mode: str
    cap: str | None
    base_url: str
    client: object  # httpx.Client
    tokenizer: object  # re-encodes the returned text for the looping measure
    pid: int | None = None  # the server's process, whose CPU time each request is also charged

    def _cpu(self) -> float | None:
        return process_cpu_s(self.pid) if self.pid and os.path.exists(f"/proc/{self.pid}/stat") else None

    def run(self, messages, max_tokens: int) -> dict:
        """The run record of one request (fields as `arms._engine_run`, from the response's stats)."""
        body = {"model": "default", "messages": list(messages), "temperature": 0, "max_tokens": max_tokens}
        cpu0, t0 = self._cpu(), time.perf_counter()
        r = self.client.post(f"{self.base_url}/v1/chat/completions", json=body, timeout=600)
        r.raise_for_status()
        reply = r.json()
        wall, cpu1 = time.perf_counter() - t0, self._cpu()
        text = reply["choices"][0]["message"]["content"] or ""
        s = reply["dspark_stats"]
        decode_s = s["time_draft_s"] + s["time_verify_s"] + s["time_accept_s"] + s["time_other_s"]
        return {
            "ids": list(self.tokenizer.encode(text, add_special_tokens=False)), "text": text,
            "tokens": reply["usage"]["completion_tokens"], "prompt_tokens": reply["usage"]["prompt_tokens"],
            "wall_s": wall, "prefill_s": s["time_prefill_s"], "decode_s": decode_s,
            # Tokens committed by rounds (after the one read at prefill): tau x rounds, as the engine counts.
            "decode_tokens": round(s["mean_accepted_length"] * s["rounds"]),
            "rounds": s["rounds"], "drafted": s["drafted_tokens"], "accepted": s["accepted_tokens"],
            "time_s": {"draft": s["time_draft_s"], "verify": s["time_verify_s"], "accept": s["time_accept_s"],
                       "other": s["time_other_s"]},
            "by_kind": s.get("by_kind", {}), "finish_reason": reply["choices"][0]["finish_reason"],
            # The server's CPU time for the request: on a CPU shared with other work, wall time also
            # counts the time others ran; CPU time of a 1-thread decode does not (10 ms resolution).
            "cpu_s": None if cpu0 is None or cpu1 is None else cpu1 - cpu0,
        }


def start_servers(modes, model: str | None, progress, drafters: dict | None = None,
                  ready_timeout: float = 900.0) -> tuple[list, dict]:
    """Start baseline and each mode's server; ([ServerProcess], {mode: /health body}).

    Started one after another: a speculative server measures its round-cost curve at start (unless
    cached), and that measurement must not share the CPU with another model loading."""
    import httpx

    servers, health = [], {}
    with httpx.Client() as client:
        try:
            for mode in (BASELINE, *modes):
                progress(f"starting dspark serve --mode {mode}")
                drafter = (drafters or {}).get(mode)
                server = ServerProcess(mode, model, ("--drafter", drafter) if drafter else ())
                servers.append(server)
                health[mode] = server.wait_ready(client, ready_timeout)
        except BaseException:
            stop_all(servers)
            raise
    return servers, health


def stop_all(servers) -> None:
    """Stop every server started (each one's own process only)."""
    for server in servers:
        server.stop()


def server_arms(servers, health: dict, client, tokenizer) -> tuple[list[ServerArm], list[str]]:
    """Arms for the servers that run what was asked; notes on those that fell back to another mode."""
    arms, skipped = [], []
    for server in servers:
        h = health[server.mode]
        served = h.get("mode", server.mode)
        if server.mode != BASELINE and served != server.mode:
            # e.g. --mode dspark with no drafter for the model serves baseline: nothing to compare.
            skipped.append(f"{server.mode}: the server runs {served} ({h.get('mode_note') or 'no drafter'})")
            continue
        name = BASELINE if server.mode == BASELINE else f"{server.mode}@auto"
        arms.append(ServerArm(name, server.mode, None if server.mode == BASELINE else "auto", server.base_url,
                              client, tokenizer, server.proc.pid))
    return arms, skipped


def run_server_bench(args, plan, prompts, meta, environment) -> dict:
    """Start the servers, time every arm on every prompt (interleaved), stop them; the report dict."""
    import httpx

    from dspark_cli.bench import core
    from dspark_cli.progress import ProgressBar, stderr_progress
    from engine.loading.target import resolve_model_path
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    tokenizer = load_tokenizer(resolve_model_path(args.model))
    servers, health = start_servers(plan.modes, args.model, stderr_progress,
                                    {"dspark": args.dspark_drafter, "dflash": args.dflash_drafter})
    try:
        with httpx.Client() as client:
            arms, skipped = server_arms(servers, health, client, tokenizer)
            payloads = [(p.id, p.messages) for p in prompts]
            records = core.time_arms(arms, payloads, plan, lambda n: ProgressBar(n, "bench --server"))
    finally:
        stop_all(servers)
    kinds = {p.id: p.kind for p in prompts}
    summ = core.summarize(records, arms, {}, kinds)
    rep = core.build_report(records, summ, {}, plan=plan, environment=environment, prompt_meta=meta,
                            target=health[BASELINE].get("model", args.model or "default"),
                            command=" ".join(["dspark", *sys.argv[1:]]), skipped=skipped)
    spec_health = {m: h for m, h in health.items() if m != BASELINE}
    rep["drafters"] = {m: h.get("drafter_kind") for m, h in spec_health.items()}
    rep["auto_cap_at_start"] = {m: h.get("cap") for m, h in spec_health.items()}
    rep["server"] = {"health": health, "request": "POST /v1/chat/completions, non-streaming, temperature 0"}
    return rep
