"""Real processes for the fault and cluster tests: spark-submit jobs, Spark daemons, kills.

Every process is started in its own session (process group), its output goes to files, and
``ProcGroup.kill`` sends SIGKILL to that group only (what a lost machine or container looks
like). Nothing here touches a process the tests did not start.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pyspark

from .conftest import FAST_JVM, REPO, SAMPLE

SPARK_HOME = Path(pyspark.__file__).resolve().parent
SPARK_SUBMIT = SPARK_HOME / "bin" / "spark-submit"
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
TRAIN = REPO / "jobs" / "train.py"
ENCODE = REPO / "jobs" / "encode.py"
# every job: no UI, few shuffle partitions (small corpora), fast executor JVMs
QUIET_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4",
              "spark.executor.extraJavaOptions": FAST_JVM}


def job_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable, PYTHONUNBUFFERED="1",
               SPARK_SUBMIT_OPTS=FAST_JVM, SPARK_DAEMON_JAVA_OPTS=FAST_JVM)
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ProcGroup:
    """A process (and all it starts) in a new session; stdout/stderr go to files."""

    def __init__(self, args: list[str], log_dir: Path, name: str,
                 env: dict[str, str] | None = None, cwd: Path = REPO):
        log_dir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.out_path = log_dir / f"{name}.out"
        self.err_path = log_dir / f"{name}.err"
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen([str(a) for a in args], stdout=out, stderr=err,
                                         env=env or job_env(), cwd=cwd,
                                         start_new_session=True)
        self.pgid = self.proc.pid

    def err(self) -> str:
        return self.err_path.read_text(errors="replace")

    def out(self) -> str:
        return self.out_path.read_text(errors="replace")

    def log(self) -> str:
        """Both streams. Under spark-submit the Python driver's output (its log, and the
        job's last line) arrives on stdout: PythonRunner merges the two streams of the
        Python process into the JVM's stdout; the JVM's own log is on stderr."""
        return self.out() + self.err()

    def last_line(self) -> str:
        lines = self.out().strip().splitlines()
        return lines[-1] if lines else ""

    def tail(self, n: int = 30) -> str:
        return ("\n".join(self.out().splitlines()[-n:]) + "\n--- stderr ---\n"
                + "\n".join(self.err().splitlines()[-n:]))

    def wait_until(self, cond: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll ``cond`` every 50 ms; fail if the process ends first or time runs out."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if cond():
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited ({self.proc.returncode}) before "
                                     f"{what}:\n{self.tail()}")
            time.sleep(0.05)
        raise AssertionError(f"{self.name}: timed out waiting for {what}:\n{self.tail()}")

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"{self.name} did not finish in {timeout} s:\n{self.tail()}") from None

    def members(self) -> list[tuple[int, str]]:
        """(pid, command line) of the live processes in this group."""
        out = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    stat = fh.read()
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) "
            if fields[0] != "Z" and int(fields[2]) == self.pgid:
                out.append((int(entry), cmd))
        return out

    def kill(self) -> None:
        """SIGKILL the whole group (no clean shutdown, no shutdown hooks)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(30)


def process_groups() -> Iterator[list[ProcGroup]]:
    """Fixture body: the process groups a test starts, all SIGKILLed at teardown (pass or
    fail). Test modules register it with ``procs = pytest.fixture(name="procs")(...)``."""
    started: list[ProcGroup] = []
    yield started
    for p in started:
        p.kill()


def remove_app_dirs(p: ProcGroup) -> None:
    """local-cluster workers always work in SPARK_HOME/work: remove this job's app dirs."""
    for app in set(re.findall(r"\bapp-\d{14}-\d{4}\b", p.err())):
        shutil.rmtree(SPARK_HOME / "work" / app, ignore_errors=True)
    with contextlib.suppress(OSError):  # only if empty (another job may be using it)
        (SPARK_HOME / "work").rmdir()


def submit(args: list[str], log_dir: Path, name: str, master: str = "local[2]",
           conf: dict[str, str] | None = None, submit_args: list[str] | None = None,
           env: dict[str, str] | None = None, job: Path = TRAIN) -> ProcGroup:
    cmd: list[str] = [str(SPARK_SUBMIT), "--master", master]
    for k, v in {**QUIET_CONF, **(conf or {})}.items():
        cmd += ["--conf", f"{k}={v}"]
    bar = [] if "--progress-bar" in args else ["--no-progress-bar"]  # (a flag goes once)
    cmd += [*(submit_args or []), str(job), *bar, *args]
    return ProcGroup(cmd, log_dir, name, env=env)


def merges_txt(run_dir: Path) -> str:
    return (run_dir / "merges.txt").read_text()


def stats(run_dir: Path) -> dict:
    return json.loads((run_dir / "stats.json").read_text())


def checkpoints(directory: Path) -> list[int]:
    """Merge counts of the complete checkpoint files in a directory, ascending."""
    if not directory.is_dir():
        return []
    return sorted(int(p.name[7:16]) for p in directory.glob("merges-*.txt"))


def newest_checkpoint(directory: Path) -> int:
    found = checkpoints(directory)
    return found[-1] if found else 0


def sample_slice(dest: Path, rows: int) -> Path:
    """The first ``rows`` rows of data/sample (corpus order), as two shards."""
    dest.mkdir(parents=True, exist_ok=True)
    table = pq.read_table(SAMPLE / "part-00000.parquet").slice(0, rows)
    half = rows // 2
    pq.write_table(table.slice(0, half), dest / "part-0.parquet")
    pq.write_table(table.slice(half), dest / "part-1.parquet")
    return dest


ROWS = 80  # ~290 KB of the sample: big enough to kill a run mid-way, small enough for CI


def shared_corpus(tmp_path_factory) -> Path:
    """The corpus every fault and cluster test uses (made once per session)."""
    path = tmp_path_factory.getbasetemp() / "spark-bpe-faults" / "corpus"
    return path if path.exists() else sample_slice(path, ROWS)


_REFERENCE: dict[tuple[str, int], Path] = {}
_ORACLE: dict[tuple, tuple[int, list]] = {}  # (corpus, settings) -> (merges asked, merge list)


def gpt2_spelling(token: bytes) -> str:
    """GPT-2's byte-level spelling of a token (written here from GPT-2's definition): the
    printable Latin-1 bytes stand for themselves, the others for chr(256), chr(257), ... in
    byte order."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)}
    others = iter(range(256, 512))
    chars = {b: chr(b) if b in printable else chr(next(others)) for b in range(256)}
    return "".join(chars[b] for b in token)


def oracle_merges(corpus: Path, cfg) -> list:
    """The merge list ``pipeline.bpe.train_oracle`` learns from a naive count of ``corpus``
    (tests/naive_count.py; files sorted by path) with the run's settings: no counting or
    training code in common with the pipeline's engines. Computed once per corpus and settings
    for the longest list asked (a shorter one is its prefix); about 2 s for 200 merges here."""
    from pipeline.bpe import initial_words, train_oracle

    from .naive_count import naive_count

    assert cfg.alphabet == "bytes" and not cfg.num_merges, "the oracle here: bytes, vocab_size"
    wanted = cfg.vocab_size - 256 - len(cfg.special_tokens)
    key = (str(corpus), cfg.text_column, cfg.pattern, tuple(cfg.special_tokens), cfg.lowercase,
           cfg.normalization, cfg.max_word_bytes, cfg.min_pair_count, cfg.max_token_bytes)
    asked, merges = _ORACLE.get(key, (0, []))
    if asked < wanted:
        files = sorted(corpus.glob("*.parquet"))
        table = naive_count([pq.read_table(f).column(cfg.text_column).to_pylist()
                             for f in files], cfg.pattern, cfg.special_tokens, cfg.lowercase,
                            cfg.normalization, cfg.max_word_bytes)
        words = table.order()
        ids, base = initial_words(words)
        merges = train_oracle(ids, [table.counts[w] for w in words], base.tokens, wanted,
                              cfg.min_pair_count, cfg.max_token_bytes or None)
        _ORACLE[key] = (wanted, merges)
    return merges[:wanted]


def oracle_merges_txt(merges: list) -> str:
    """merges.txt for a merge list: GPT-2 spellings, a repeated pair of spellings kept once."""
    vocab = [bytes([b]) for b in range(256)]
    lines, seen = ["#version: 0.2"], set()
    for m in merges:
        vocab.append(vocab[m.left] + vocab[m.right])
        pair = f"{gpt2_spelling(vocab[m.left])} {gpt2_spelling(vocab[m.right])}"
        if pair not in seen:
            seen.add(pair)
            lines.append(pair)
    return "\n".join(lines) + "\n"


def reference_run(spark, corpus: Path, vocab_size: int) -> Path:
    """An uninterrupted run in local mode (this process's local[2] session, driver engine),
    with the same defaults as the jobs (conf/default.toml). The corpus is counted once.

    Its merge list is asserted equal to the oracle's (:func:`oracle_merges`), merges.txt to
    the oracle's spelled independently: a test comparing a run's merges.txt with this one
    compares it with the oracle's."""
    from pipeline.config import resolve, validate
    from pipeline.train import train

    key = (str(corpus), vocab_size)
    if key not in _REFERENCE:
        root = corpus.parent
        words = root / "reference-words"
        run = root / f"reference-{vocab_size}"
        src = ["--words", str(words)] if words.exists() else ["--input", str(corpus)]
        cfg = validate(resolve([*src, "--output", str(run), "--vocab-size", str(vocab_size),
                                "--engine", "local", "--no-progress-bar"]), "train")
        merges = train(spark, cfg).merges
        expected = oracle_merges(corpus, cfg)
        assert len(expected) == vocab_size - 256 - len(cfg.special_tokens), "out of pairs"
        assert merges == expected, next(
            f"the local engine's merge {i} is {got}, the oracle's {want}"
            for i, (got, want) in enumerate(zip([*merges, None], [*expected, None]))
            if got != want)
        assert merges_txt(run) == oracle_merges_txt(expected)
        if not words.exists():
            (run / "words").rename(words)
        _REFERENCE[key] = run
    return _REFERENCE[key]
