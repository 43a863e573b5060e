"""Building the SparkSession the jobs and tests use."""

from __future__ import annotations

import _thread
import contextlib
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import Accumulator, AccumulatorParam, SparkContext
from pyspark.sql import SparkSession

from pipeline import fsutil
from pipeline.config import Config, ConfigError
from pipeline.progress import stderr_reaches_a_terminal

_settings: dict[str, str] = {}  # the Spark settings of the session built last


def spark_settings() -> dict[str, str]:
    """The settings of the session built last (kept for error messages after the JVM died)."""
    return dict(_settings)


class DeferredSession:
    """Stands in for a SparkSession whose SparkContext is ready at once (RDD jobs can run) and
    whose session is created when first used, or earlier in a background thread after
    :meth:`start`.

    Creating the session takes seconds of JVM time in a fresh Spark 4 application (it loads
    the SQL extensions, ML functions among them, through Scala reflection). A run that never
    needs Spark SQL (local corpus read with pyarrow, training on the driver, local outputs)
    skips that work; one that will need it calls :meth:`start` early so it overlaps the count."""

    def __init__(self, builder: SparkSession.Builder, sc: SparkContext,
                 after: Callable[[SparkSession], None]) -> None:
        self.sparkContext = sc
        self._builder = builder
        self._after = after
        self._session: SparkSession | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._on_create: list[Callable[[SparkSession], None]] = []
        self._hooks = threading.RLock()  # held while hooks run: every user waits for them

    @contextlib.contextmanager
    def when_created(self, fn: Callable[[SparkSession], None]) -> Iterator[None]:
        """While this lasts, ``fn(session)`` runs once when the session is first used (in
        the thread that uses it first; any other thread using it waits until it has run): a
        setting that must hold while Spark SQL reads, made without creating the session for a
        run that never needs one. After the block ``fn`` never runs (one running is waited
        for)."""
        with self._hooks:
            self._on_create.append(fn)
        try:
            yield
        finally:
            with self._hooks:
                if fn in self._on_create:
                    self._on_create.remove(fn)

    def start(self) -> None:
        """Begin creating the session in the background (no-op once begun)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._create, name="spark-bpe-session",
                                                daemon=True)
                self._thread.start()

    def _create(self) -> None:
        try:
            session = self._builder.getOrCreate()
            self._after(session)
            self._session = session
        except BaseException as exc:  # noqa: BLE001 - re-raised where the session is used
            self._error = exc

    @property
    def created(self) -> bool:
        """Whether the session's creation has begun."""
        return self._thread is not None

    @property
    def ready(self) -> bool:
        """Whether the session exists (using it does not wait)."""
        return self._session is not None

    def session(self) -> SparkSession:
        self.start()
        assert self._thread is not None
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._session is not None
        with self._hooks:  # (one at a time: a hook that raises leaves the others queued)
            while self._on_create:
                self._on_create.pop(0)(self._session)
        return self._session

    def __getattr__(self, name: str):  # anything but sparkContext: the session's
        return getattr(self.session(), name)

    def stop(self) -> None:
        if self._thread is not None:
            self._thread.join()
        if self._session is not None:
            self._session.stop()
        else:
            self.sparkContext.stop()


def start_session(spark: SparkSession) -> None:
    """Have a :class:`DeferredSession` begin creating its session now (in the background)."""
    if isinstance(spark, DeferredSession):
        spark.start()


# spark-submit names an application after its script unless --name is given
_DEFAULT_APP_NAMES = {"train.py", "count_words.py", "encode.py", "pyspark-shell"}


def file_reader(spark: SparkSession, skip_corrupt: bool = False) -> Any:
    """``spark.read`` that skips unreadable files exactly when ``skip_corrupt`` (the data source
    option, which wins over the session's spark.sql.files.ignoreCorruptFiles: a session that
    skips them would drop a damaged word-table file's words silently)."""
    return spark.read.option("ignoreCorruptFiles", "true" if skip_corrupt else "false")


_NO_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")


def worker_python_failure(exc: BaseException) -> str:
    """For a task's failure to import a module this job needs (``pipeline``, ``pyarrow``,
    ``regex``...: the workers run a Python without them), one line naming the fix; else ""."""
    text = str(exc)
    if "PythonException" not in type(exc).__name__ and "Traceback" not in text \
            and "Python worker" not in text:
        return ""
    m = _NO_MODULE.search(text)
    if m is None:
        return ""
    return (f"the Spark workers' Python cannot import {m.group(1)!r}: run them with the "
            "Python that has spark-bpe and its dependencies (PYSPARK_PYTHON or "
            "spark.pyspark.python; in a session you build yourself, set "
            "os.environ['PYSPARK_PYTHON'] = sys.executable before building it)")


def default_worker_python(master: str) -> None:
    """On this machine (``local``, ``local[n]``, ``local-cluster[...]``) Python workers use
    this interpreter, the one with our dependencies, unless PYSPARK_PYTHON says otherwise; on
    a cluster they use what the user set (PYSPARK_PYTHON, ``spark.pyspark.python``, which
    spark-submit passes on as PYSPARK_PYTHON) or Spark's default, ``python3``: the driver's
    path may not exist on the executors' machines."""
    if master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def build_session(cfg: Config, app_name: str, extra_conf: dict[str, str] | None = None,
                  deferred: bool = False) -> SparkSession:
    """A session for a job. ``cfg.master`` (the job's own ``--master``) wins over
    spark-submit's master; else spark-submit's; else local[*]. It changes only the master.

    Spark's settings are the user's: an option is set here only where spark-submit (``--conf``,
    ``--name``, ``spark-defaults.conf``) left it unset (but for what the job's own flags set
    explicitly: ``--master``, ``--spark-ui on|off``), and the log level is never touched
    (the quick start ships ``conf/spark/log4j2.properties``; ``--conf spark.log.level=...`` or
    the user's own log4j config decide). What is set where unset: the application name, the
    web UI (``cfg.spark_ui``: ``auto`` starts it on a cluster master and not in local modes,
    where it costs about 1.5 s per job), Spark's console progress bar off when stderr is not
    a terminal or ours is drawn there, Arrow for PySpark, the driver's address from
    ``SPARK_LOCAL_IP`` (tests, CI, the quick start bind to loopback), the SQL shuffle
    partitions (``cfg.shuffle_partitions``, explicit, always wins), Hadoop's umask
    (:func:`hadoop_umask_from_process`) and, in local modes, the workers' Python
    (:func:`default_worker_python`).

    ``deferred``: start the SparkContext now and return a :class:`DeferredSession`, which
    creates the session when first used (or in the background after :func:`start_session`).
    """
    submitted = _submit_conf()  # (the master aside, a job's --master keeps them all)
    options: dict[str, str] = {}

    def default(key: str, value: str) -> None:
        if key not in submitted:
            options[key] = value

    master = cfg.master or submitted.get("spark.master", "local[*]")
    default_worker_python(master)
    if cfg.master:
        options["spark.master"] = master
    default("spark.master", master)
    if submitted.get("spark.app.name") == "pyspark-shell":  # a plain `python jobs/...`:
        submitted.pop("spark.ui.showConsoleProgress", None)  # Spark's shell default, not yours
    if submitted.get("spark.app.name", "") in _DEFAULT_APP_NAMES:
        submitted.pop("spark.app.name")
    default("spark.app.name", app_name)
    ui = str(web_ui_enabled(cfg.spark_ui, master)).lower()
    if cfg.spark_ui == "auto":  # an explicit on/off wins, as --master does
        default("spark.ui.enabled", ui)
    else:
        options["spark.ui.enabled"] = ui
    default("spark.sql.execution.arrow.pyspark.enabled", "true")
    if not stderr_reaches_a_terminal() or cfg.progress_bar:  # Spark's \r bar (on for a
        # plain `python jobs/...`, a "shell" to Spark) would garble a log, or fight ours
        default("spark.ui.showConsoleProgress", "false")
    local_ip = os.environ.get("SPARK_LOCAL_IP")
    if local_ip:
        default("spark.driver.host", local_ip)
        default("spark.driver.bindAddress", local_ip)
    options.update(extra_conf or {})
    builder = SparkSession.builder
    for k, v in options.items():
        builder = builder.config(k, v)
    user_shuffle = "spark.sql.shuffle.partitions" in submitted

    def after(session: SparkSession) -> None:
        if cfg.shuffle_partitions or not user_shuffle:
            shuffle = cfg.shuffle_partitions or max(2, 2 * session.sparkContext.defaultParallelism)
            session.conf.set("spark.sql.shuffle.partitions", str(shuffle))
        why = ("config key 'shuffle_partitions'" if cfg.shuffle_partitions
               else "spark-submit" if user_shuffle else "unset: 2 per core")
        logging.getLogger("pipeline.spark_session").info(
            "Spark SQL session: spark.sql.shuffle.partitions = %s (%s)",
            session.conf.get("spark.sql.shuffle.partitions"), why)

    if deferred:
        from pyspark import SparkConf

        with _master_checked(master, bool(cfg.master)):
            sc = SparkContext.getOrCreate(SparkConf().setAll(list(options.items())))
        _started(sc)
        return DeferredSession(builder, sc, after)  # type: ignore[return-value]
    with _master_checked(master, bool(cfg.master)):
        spark = builder.getOrCreate()
    _started(spark.sparkContext)
    after(spark)
    return spark


@contextlib.contextmanager
def _master_checked(master: str, ours: bool) -> Iterator[None]:
    """A master URL Spark cannot parse is a config error (one line, exit 2), not a failure
    with a Java stack trace. Spark decides (cluster managers are plug-ins: no list here)."""
    try:
        yield
    except Exception as exc:
        if not any(m in str(exc) for m in ("Could not parse Master URL",
                                             "Asked to run locally with 0 threads")):
            raise
        key = "config key 'master'" if ours else "spark-submit's --master"
        raise ConfigError(f"{key}: Spark cannot use the master URL {master!r} (local[N], "
                          "local-cluster[N,C,M], spark://HOST:PORT, yarn, k8s://URL, or a "
                          "cluster manager's own)") from None


on_jvm_shutdown: Callable[[], None] | None = None  # set by pipeline.cli while a job runs
# set by pipeline.cli under spark-submit: stops this driver (as SIGTERM does) if the JVM that
# runs it is gone; called just before a run is published (the watcher looks once a second)
def no_jvm_check() -> None:
    """Outside spark-submit: no JVM runs this driver."""


stop_if_jvm_gone: Callable[[], object] = no_jvm_check
_jvm_hook: tuple | None = None  # (gateway, the JVM's hook thread)


class _ShutdownHook:
    """A ``java.lang.Runnable`` implemented in Python (py4j callback): the JVM runs it in its
    shutdown hooks."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn

    def run(self) -> None:
        self.fn()

    class Java:
        implements = ["java.lang.Runnable"]


def hold_jvm_shutdown() -> None:
    """Under spark-submit the JVM is this process's parent, and a scheduler's SIGTERM reaches
    only the JVM: register a JVM shutdown hook that calls :data:`on_jvm_shutdown` (set by the
    job's entry point) through py4j's callback server (loopback, like the gateway). Called as
    the job starts, before its SparkContext exists (the gateway spark-submit opened for this
    driver is there from the start: pyspark's own connection to it, made now instead of when
    the context is created), so that a SIGTERM while the job starts up is its last line too;
    and again when the context has started (a no-op once registered)."""
    global _jvm_hook
    if on_jvm_shutdown is None or _jvm_hook is not None \
            or "PYSPARK_GATEWAY_PORT" not in os.environ:
        return
    from pyspark.java_gateway import ensure_callback_server_started

    try:
        SparkContext._ensure_initialized()
        gateway = SparkContext._gateway
        ensure_callback_server_started(gateway)
        jvm = gateway.jvm
        thread = jvm.java.lang.Thread(_ShutdownHook(on_jvm_shutdown), "spark-bpe-sigterm")
        _say_name_if_python_is_gone(jvm, thread)
        jvm.java.lang.Runtime.getRuntime().addShutdownHook(thread)
        _jvm_hook = (gateway, thread)
    except Exception as exc:  # noqa: BLE001 - without it SIGTERM still stops the JVM
        logging.getLogger(__name__).warning("no JVM shutdown hook (%s): a SIGTERM to "
                                            "spark-submit will not reach this driver", exc)
        return
    set_last_words(last_words() if last_words is not None else "")


def _uncaught_handler(jvm: Any, action: str, event_property: str | None = None) -> Any:
    """A ``Thread.UncaughtExceptionHandler`` that calls ``System.out.<action>`` (with the
    thread's ``event_property``), made by ``java.beans.EventHandler`` (JDK classes only)."""
    handler_class = jvm.java.lang.Class.forName("java.lang.Thread$UncaughtExceptionHandler")
    if event_property is None:
        return jvm.java.beans.EventHandler.create(handler_class, jvm.java.lang.System.out,
                                                  action)
    return jvm.java.beans.EventHandler.create(handler_class, jvm.java.lang.System.out, action,
                                              event_property)


def _say_name_if_python_is_gone(jvm: Any, thread: Any) -> None:
    """If this Python driver is dead when the JVM shuts down (SIGKILL: the kernel's or a
    container's out-of-memory killer), the hook's call into it fails in the JVM: instead of
    py4j's stack trace, the JVM prints the hook thread's name, which :func:`set_last_words`
    keeps as the job's last line (JDK classes only: ``java.beans.EventHandler`` makes an
    uncaught-exception handler that calls ``System.out.println(thread.getName())``: where
    PythonRunner sends the Python driver's own lines, stdout and stderr merged)."""
    try:
        thread.setUncaughtExceptionHandler(_uncaught_handler(jvm, "println", "name"))
    except Exception as exc:  # noqa: BLE001 - a JDK without java.desktop: py4j's trace then
        logging.getLogger(__name__).debug("no last words for a killed driver: %s", exc)


last_words: Callable[[], str] | None = None  # set by pipeline.cli: the line for a killed driver


def set_last_words(text: str) -> None:
    """The line the JVM prints if this Python driver dies without a word (see
    :func:`_say_name_if_python_is_gone`); '' leaves the hook's own name."""
    if _jvm_hook is None:
        return
    with contextlib.suppress(Exception):  # only a better last line: never fail the job
        _jvm_hook[1].setName(text or "spark-bpe-sigterm")


def silence_last_words() -> None:
    """The job has ended (its last line said): a call of the JVM's shutdown hook into this
    Python that fails from now on (this process exits while a SIGTERM's hook waits in it) is
    not a killed driver, and must not print :func:`set_last_words`' line."""
    if _jvm_hook is None:
        return
    gateway, thread = _jvm_hook
    with contextlib.suppress(Exception):  # (the JVM may be gone)
        thread.setUncaughtExceptionHandler(_uncaught_handler(gateway.jvm, "flush"))


def jvm_exit_by_uncaught_error() -> str:
    """Called during the JVM's shutdown: the name of the thread whose uncaught error made
    Spark exit the JVM (``SparkUncaughtExceptionHandler`` calls ``System.exit`` and waits in
    it: in local mode an executor task that ran out of heap takes the driver JVM with it,
    exit code 52), else ''. Only Spark's task threads are looked at (a few py4j calls)."""
    if _jvm_hook is None:
        return ""
    gateway, _ = _jvm_hook
    try:
        traces = gateway.jvm.java.lang.Thread.getAllStackTraces()
        for thread in list(traces.keySet()):
            name = str(thread.getName())
            if not name.startswith("Executor task launch worker"):
                continue
            if any("SparkUncaughtExceptionHandler" in str(frame.getClassName())
                   for frame in traces.get(thread)):
                return name
    except Exception:  # noqa: BLE001 - the JVM is going away: no answer is no evidence
        return ""
    return ""


def release_jvm_shutdown_hook() -> None:
    """The job is over: the JVM's normal exit must not call back into a finished Python."""
    global _jvm_hook
    if _jvm_hook is None:
        return
    gateway, thread = _jvm_hook
    _jvm_hook = None
    with contextlib.suppress(Exception):
        gateway.jvm.java.lang.Runtime.getRuntime().removeShutdownHook(thread)


UMASK_KEY = "fs.permissions.umask-mode"


def hadoop_umask_from_process(sc: SparkContext) -> None:
    """Files Spark writes (word tables, encoded corpora) follow this process's umask, as the
    files we write ourselves do, unless the user set Hadoop's ``fs.permissions.umask-mode``
    (``--conf spark.hadoop.fs.permissions.umask-mode=...``, a core-site.xml): Hadoop's own
    default is 022 whatever the umask."""
    conf = sc._jsc.hadoopConfiguration()
    sources = conf.getPropertySources(UMASK_KEY)
    if sources is not None and any(str(src) != "core-default.xml" for src in sources):
        return  # set by the user (the sources name where: a file, or "programmatically")
    conf.set(UMASK_KEY, f"{fsutil.umask():03o}")


def _started(sc: SparkContext) -> None:
    hold_jvm_shutdown()
    _sigint_outside_finalizers()
    hadoop_umask_from_process(sc)
    _settings.update(sc.getConf().getAll())
    logging.getLogger("pipeline.spark_session").info(
        "Spark application '%s' (%s), master %s, %d cores, web UI %s", sc.appName,
        sc.applicationId, sc.master, sc.defaultParallelism, sc.uiWebUrl or "off")


_FINALIZERS = ("_garbage_collect_object", "__del__")  # py4j's weakref callback, any __del__


def _sigint_outside_finalizers() -> None:
    """PySpark's SIGINT handler (cancel every job, raise KeyboardInterrupt) raises wherever
    the main thread is. Inside a finalizer, py4j's garbage-collection callback of a Java
    object that often, Python prints "Exception ignored" and goes on: Ctrl-C was lost and the
    job ran on (seen while counting). Wrapped here: a SIGINT that comes there is delivered
    again 50 ms later (``_thread.interrupt_main``), when the finalizer has returned."""
    if threading.current_thread() is not threading.main_thread():
        return
    inner = signal.getsignal(signal.SIGINT)
    if not callable(inner) or getattr(inner, "spark_bpe_wrapped", False):
        return

    def handler(signum: int, frame: Any) -> None:
        f = frame
        while f is not None:
            if f.f_code.co_name in _FINALIZERS:
                threading.Timer(0.05, _thread.interrupt_main).start()
                return
            f = f.f_back
        inner(signum, frame)

    handler.spark_bpe_wrapped = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGINT, handler)


def web_ui_enabled(mode: str, master: str) -> bool:
    """``spark_ui``: on, off, or auto = on for a cluster master, off for local modes."""
    return mode == "on" or (mode == "auto" and not master.startswith("local"))


def _submit_conf() -> dict[str, str]:
    """Settings spark-submit passed to this driver (``--master``, ``--conf``).

    They live in the JVM's system properties, so connect to the JVM first: a ``SparkConf()``
    made before that is an empty Python-side dict, and every job would silently run in
    ``local[*]`` whatever ``--master`` said. (Under plain ``python`` this starts the gateway
    that ``getOrCreate`` would start anyway.)"""
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()
    return dict(SparkConf().getAll())


@contextlib.contextmanager
def job_group(sc: SparkContext, name: str) -> Iterator[str]:
    """Run the jobs this thread submits under a fresh job group (for :func:`task_progress`)."""
    group = f"spark-bpe-{name}-{uuid.uuid4().hex[:8]}"
    keys = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
    previous = {k: sc.getLocalProperty(k) for k in keys}  # (the caller's, in a notebook)
    sc.setJobGroup(group, f"spark-bpe {name}")
    try:
        yield group
    finally:
        for k, v in previous.items():
            sc.setLocalProperty(k, v)  # type: ignore[arg-type]  (None removes it)


class PerTask(AccumulatorParam):
    """{task: value}: a retried task replaces its own entry."""

    def zero(self, value: dict) -> dict:
        return {}

    def addInPlace(self, a: dict, b: dict) -> dict:  # noqa: N802 - Spark's name
        a.update(b)
        return a


class TaskErrors:
    """Errors a task finds that no retry mends (an input file that is corrupt): the task
    reports the error (:meth:`report`) and ends without failing, so that Spark does not run it
    again (``spark.task.maxFailures`` times on a cluster, each with a Python traceback in the
    log) while the other tasks read on. The driver runs the job inside :meth:`raising`, which
    cancels the job group at the first report and raises the error the task would have raised.
    Pickled into the tasks."""

    POLL_SECONDS = 0.2
    SETTLE_SECONDS = 10.0  # how long the driver waits for the cancelled tasks to end

    def __init__(self, sc: SparkContext):
        self.found = sc.accumulator({}, PerTask())  # {task: message}

    def report(self, task: int, error: Exception) -> None:
        """Task side."""
        self.found.add({task: str(error)})

    def first(self) -> str | None:
        """Driver side: the message of the lowest task that reported, if any."""
        found = self.found.value
        return found[min(found)] if found else None

    @contextlib.contextmanager
    def raising(self, sc: SparkContext, error: Callable[[str], Exception]) -> Iterator[None]:
        """Run the job in the block; at the first report, cancel this thread's job group (if
        it has one) and raise ``error(message)`` in place of whatever the job ended with."""
        group = sc.getLocalProperty("spark.jobGroup.id")
        done = threading.Event()

        def watch() -> None:
            while not done.wait(self.POLL_SECONDS):
                if self.found.value:
                    with contextlib.suppress(Exception):  # (the job may have ended since)
                        sc.cancelJobGroup(group)
                    return

        watcher = threading.Thread(target=watch, name="spark-bpe-task-errors", daemon=True)
        if group is not None:
            watcher.start()
        try:
            yield
        except Exception:
            self._raise_first(sc, group, error)
            raise  # (an interrupt or SystemExit is the run's to report: its exit code)
        finally:
            done.set()
            if watcher.is_alive():
                watcher.join()
        self._raise_first(sc, group, error)

    def _raise_first(self, sc: SparkContext, group: str | None,
                     error: Callable[[str], Exception]) -> None:
        message = self.first()
        if message is None:
            return
        if group is not None:  # the cancelled tasks end first (a driver that stops under
            _wait_for_tasks(sc, group, self.SETTLE_SECONDS)  # them logs Java errors)
        raise error(message) from None


def _wait_for_tasks(sc: SparkContext, group: str, seconds: float) -> None:
    """Wait (at most ``seconds``) until no task of the job group's jobs is running."""
    tracker = sc.statusTracker()
    deadline = time.monotonic() + seconds
    with contextlib.suppress(Exception):  # (a stopped context: nothing runs)
        while time.monotonic() < deadline:
            stages = [s for j in tracker.getJobIdsForGroup(group)
                      for s in getattr(tracker.getJobInfo(j), "stageIds", ())]
            infos = [tracker.getStageInfo(s) for s in stages]
            if not any(i is not None and i.numActiveTasks for i in infos):
                return
            time.sleep(0.1)


class TaskReporter:
    """Inside one task: its running totals (rows and bytes read), written to a small file the
    driver reads (local masters) as it starts, at the first update, then at most every
    ``REPORT_SECONDS``, and at the end (marked ended); on a cluster, only at the end (an
    accumulator)."""

    def __init__(self, counts: TaskCounts, task: int):
        self.counts, self.task = counts, task
        if counts.directory is not None:  # running from now (Spark's tracker hears late)
            self._write(0, 0)
        self.next = time.monotonic()  # the first update is written at once

    def update(self, rows: int, nbytes: int) -> None:
        if self.counts.directory is not None and time.monotonic() >= self.next:
            self._write(rows, nbytes)

    def finish(self, rows: int, nbytes: int) -> None:
        if self.counts.directory is not None:
            self._write(rows, nbytes, ended=True)
        else:
            self.counts.ended.add({self.task: (rows, nbytes)})

    def _write(self, rows: int, nbytes: int, ended: bool = False) -> None:
        self.next = time.monotonic() + REPORT_SECONDS
        path = os.path.join(self.counts.directory or "", f"task-{self.task}")
        with contextlib.suppress(OSError):  # progress never fails a task
            with open(f"{path}.{os.getpid()}.tmp", "w") as fh:
                fh.write(f"{rows} {nbytes} {int(ended)}\n")
            os.replace(f"{path}.{os.getpid()}.tmp", path)


REPORT_SECONDS = 2.0


@dataclass
class TaskCounts:
    """Rows and bytes read so far by the tasks of one stage, for its heartbeats. With a local
    master each task writes its running totals to a file in ``directory`` every few seconds
    and the driver sums them: a long task shows progress while it runs. On a cluster a task's
    totals arrive when it ends (``ended``, an accumulator). Pickled into the tasks."""

    directory: str | None
    ended: Accumulator
    total_rows: int | None = None  # rows to read, when known before the tasks run
    phase: str = ""  # what the driver does after the tasks, for the heartbeat
    on_phase: Callable[[str | None], None] | None = None  # set by read_progress (driver)

    def begin(self, phase: str) -> None:
        """Start a phase of the stage: "" when the tasks that read start, else what the
        driver does after them (merging their output, say). Its heartbeat counts the Spark
        tasks of this phase's jobs only, and its rate starts now."""
        if self.on_phase is not None:  # first: a heartbeat must not see the new phase
            self.on_phase(phase)  # with the old one's jobs
        self.phase = phase

    def end_reading(self) -> None:
        """The reading's tasks have all ended (a stage with no phase after them, the encode):
        its end line says so, whatever Spark's status tracker, which hears late, says yet."""
        if self.on_phase is not None:
            self.on_phase(None)

    @classmethod
    def create(cls, sc: SparkContext, local: bool | None = None) -> TaskCounts:
        """``local``: whether the tasks share this machine's disk (default: a local master)."""
        local = sc.master.startswith("local") if local is None else local
        return cls(tempfile.mkdtemp(prefix="spark-bpe-progress-") if local else None,
                   sc.accumulator({}, PerTask()))

    def reporter(self, task: int) -> TaskReporter:
        return TaskReporter(self, task)

    def totals(self) -> tuple[int, int]:
        """(rows, bytes) read so far (driver side)."""
        return self.progress()[:2]

    def progress(self) -> tuple[int, int, int | None]:
        """(rows, bytes, running tasks): the running ones are those that have started and
        not ended (local masters; None on a cluster): Spark's status tracker may count one of
        two tasks that started together for the first 10-15 s (its live updates are
        throttled)."""
        if self.directory is None:
            parts = [(*p, 1) for p in self.ended.value.values()]
        else:
            parts = self._task_files()
        running = None if self.directory is None else sum(not p[2] for p in parts)
        return sum(p[0] for p in parts), sum(p[1] for p in parts), running

    def _task_files(self) -> list[tuple[int, int, int]]:
        assert self.directory is not None
        parts = []
        for name in os.listdir(self.directory):
            if not name.endswith(".tmp"):
                with contextlib.suppress(OSError, ValueError), \
                        open(os.path.join(self.directory, name)) as fh:
                    rows, nbytes, ended = fh.read().split()
                    parts.append((int(rows), int(nbytes), int(ended)))
        return parts

    def close(self) -> None:
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __getstate__(self) -> dict:  # what a task needs
        return {"directory": self.directory, "ended": self.ended}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["directory"], state["ended"])  # type: ignore[misc]


def read_progress(sc: SparkContext, group: str, counts: TaskCounts) -> Callable[[], dict]:
    """A poll for :class:`pipeline.progress.Stage` of a stage that reads input: rows (out of
    ``counts.total_rows`` when known, with the ETA from them), bytes read and their rate, and
    tasks done out of all from Spark's status tracker. After :meth:`TaskCounts.begin` of a
    phase the tasks are those of the jobs it started since, not earlier ones (whose totals
    would make the share done go backwards), and no share or ETA (Spark knows a job's tasks
    only when it starts it); at the end, the reading's."""
    tracker = sc.statusTracker()

    def jobs() -> frozenset[int]:
        return frozenset(tracker.getJobIdsForGroup(group))

    state: dict = {"began": time.monotonic(), "read_began": None, "read_seconds": None,
                   "before_read": frozenset(), "before_phase": frozenset(), "read_jobs": None}

    def on_phase(name: str | None) -> None:
        now, known = time.monotonic(), jobs()
        if name is None:  # the reading ended, no phase follows (TaskCounts.end_reading)
            if state["read_seconds"] is None and state["read_began"] is not None:
                state.update(read_seconds=now - state["read_began"],
                             read_jobs=known - state["before_read"])
            return
        update: dict = {"began": now, "before_phase": known}
        if not name:
            update.update(read_began=now, before_read=known)
        elif state["read_seconds"] is None and state["read_began"] is not None:
            update.update(read_seconds=now - state["read_began"],
                          read_jobs=known - state["before_read"])
        state.update(update)  # one step: a heartbeat sees the old phase or the new one

    counts.on_phase = on_phase
    reading = task_progress(sc, group, lambda job: job not in state["before_read"] and (
        state["read_jobs"] is None or job in state["read_jobs"]))
    phase_tasks = task_progress(sc, group, lambda job: job not in state["before_phase"])

    def poll() -> dict:
        t = reading()
        rows, nbytes, running = counts.progress()
        read_began = state["read_began"] or state["began"]
        seconds = state["read_seconds"] or time.monotonic() - read_began
        out: dict = {"tasks": f"{t['done']}/{t.get('total', '?')}",
                     "running": t["running"] if running is None else max(running, t["running"]),
                     "rows": rows, "bytes_read": nbytes,
                     "bytes_per_s": int(nbytes / max(seconds, 1e-3)),
                     "rate_from": (read_began, 0)}
        if counts.phase:  # after the reading: the tasks this phase has run, no share done
            # of all (its later jobs are not known yet: 8/8 would become 8/20), its note
            p = phase_tasks()
            out.update(unit="tasks", done=p["done"], total=None, running=p["running"],
                       tasks=None, rate_from=(state["began"], 0), note=counts.phase)
        elif state["read_seconds"] is not None:  # the end: what was read, at what rate
            out.update(unit="rows", done=rows, total=counts.total_rows, rows=None,
                       running=None, rate_from=(time.monotonic() - seconds, 0))
            if t.get("total"):  # (its jobs have ended: Spark's tracker may not know it yet)
                out["tasks"] = f"{t['total']}/{t['total']}"
        elif counts.total_rows:
            out.update(unit="rows", done=min(rows, counts.total_rows), total=counts.total_rows,
                       rows=None)
        elif state["read_began"] is None:  # not reading yet (no begin("")): these are
            # other jobs' tasks (a schema inferred, say), no share of all
            out.update(unit="tasks", done=t["done"], total=None, tasks=None)
        else:
            out.update(unit="tasks", done=t["done"], total=t.get("total"), tasks=None)
        return out

    return poll


def task_progress(sc: SparkContext, group: str,
                  include: Callable[[int], bool] = lambda job: True) -> Callable[[], dict]:
    """A poll for :class:`pipeline.progress.Stage`: tasks done, total and running in the
    group's jobs (those whose ids ``include`` accepts), from Spark's status tracker."""
    tracker = sc.statusTracker()

    def poll() -> dict:
        done = total = running = 0
        for job_id in tracker.getJobIdsForGroup(group):
            if not include(job_id):
                continue
            job = tracker.getJobInfo(job_id)
            ended = job is not None and job.status == "SUCCEEDED"
            for stage_id in (job.stageIds if job else ()):
                st = tracker.getStageInfo(stage_id)
                if st is not None:  # a finished job's stages that did not run were skipped
                    total += st.numCompletedTasks if ended else st.numTasks
                    done += st.numCompletedTasks
                    running += st.numActiveTasks
        out: dict = {"done": done, "running": running}
        if total:
            out["total"] = total
        return out

    return poll


def warm_python_workers(spark: SparkSession, prepare: Callable[[], object],
                        name: str) -> threading.Thread:
    """Start the executors' Python workers of ``mapInArrow`` (reused by later jobs) and call
    ``prepare`` in each (compile a pattern, build an encoder), in a background job while the
    driver does other work: in a fresh application that start-up takes seconds. Never fails:
    it is only an optimisation (join the thread before stopping Spark)."""

    def warm(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        prepare()
        for b in batches:
            yield pa.RecordBatch.from_pydict({"n": pa.array([b.num_rows], pa.int64())})

    def run() -> None:
        with contextlib.suppress(Exception):
            n = spark.sparkContext.defaultParallelism
            spark.range(0, n, numPartitions=n).mapInArrow(warm, "n long").collect()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread

