"""Iceberg's Java API through Py4J: class handles, exception classes, iterables and lists, the REST sequence-number
race (`icemaint.engine.commits` makes a commit again when it lost a race).

Shared by the staging, retention and revert engines; no Spark session of its own.
"""

from __future__ import annotations

from contextlib import contextmanager
from icemaint.errors import one_line

# Names PySpark looks up on the JVM view in every DataFrame call (`F.expr`, `selectExpr`, ...). Py4J resolves a
# bare name through the view's star imports one by one, each a failed class lookup that searches every jar on
# the class path; imported as single classes they resolve at once (measured: `F.expr` 0.45 -> 0.3 ms,
# `selectExpr` 3.1 -> 2.2 ms, and the JVM's driver thread spent 14% of its samples in those lookups).
PYSPARK_HOT_CLASSES = (
    "org.apache.spark.sql.SparkSession", "org.apache.spark.sql.functions", "org.apache.spark.sql.Encoders",
    "org.apache.spark.api.python.PythonUtils", "org.apache.spark.api.python.SerDeUtil",
    "org.apache.spark.sql.api.python.PythonSQLUtils",
)


def import_hot_classes(jvm) -> None:
    """Adds PYSPARK_HOT_CLASSES to the session's JVM view as single-class imports (what they resolve to is
    unchanged: each is the class its star import already found)."""
    from py4j.java_gateway import java_import

    for fqn in PYSPARK_HOT_CLASSES:
        java_import(jvm, fqn)


_CLASSES: dict = {}
GUAVA_LISTS = "org.apache.iceberg.relocated.com.google.common.collect.Lists"  # Iceberg's relocated Guava


def java_class(jvm, fqn: str):
    """A handle on the Java class `fqn` (static methods, constructors) without Py4J walking its package path:
    `jvm.org.apache.iceberg.X` asks the JVM about `org`, `org.apache`, ... in turn, each a failed class lookup
    across every jar (~0.3-0.9 ms a use); the handle is made once per gateway and costs no call."""
    from py4j.java_gateway import JavaClass

    client = jvm._gateway_client
    key = (id(client), fqn)
    handle = _CLASSES.get(key)
    if handle is None or handle._gateway_client is not client:
        handle = _CLASSES[key] = JavaClass(fqn, client)
    return handle


def answer_without_delay(jvm, gateway) -> int:
    """Sets TCP_NODELAY on the JVM's end of every Py4J connection open now (one per Python thread that called the
    JVM); the number set. Best effort: a gateway without that list changes nothing.

    Py4J's Java side writes an answer through an 8 KiB buffer, so an answer longer than that leaves in two or more
    writes; with Nagle's algorithm on, the last write waits for the first one's acknowledgement, which the
    Python side delays by up to 40 ms. Measured on this machine: a 9 KiB or 20 KiB string took 41-44 ms to come
    back, 0.1-0.2 ms with TCP_NODELAY (a 1 KiB one 0.1 ms either way). Answers that long are ordinary here: the
    digest's sample fingerprints, the planned files of a date described in bulk.
    """
    from py4j.protocol import Py4JError

    server = getattr(gateway, "java_gateway_server", None)
    if server is None:
        return 0
    try:
        field = java_class(jvm, "java.lang.Class").forName("py4j.GatewayServer").getDeclaredField("connections")
        field.setAccessible(True)
        connections = java_class(jvm, "java.util.ArrayList")(field.get(server))  # a copy: threads may connect
        count = 0
        for i in range(connections.size()):
            socket = connections.get(i).getSocket()
            if not socket.getTcpNoDelay():
                socket.setTcpNoDelay(True)
            count += 1
        return count
    except Py4JError:
        return 0


CONFLICT_CLASSES = frozenset({"org.apache.iceberg.exceptions.ValidationException",
                              "org.apache.iceberg.exceptions.CommitFailedException"})
COMMIT_STATE_UNKNOWN = "org.apache.iceberg.exceptions.CommitStateUnknownException"


def java_exception_class(exc: BaseException) -> str | None:
    """The Java class name carried by a Py4J error (or its first Iceberg cause), else None."""
    java = getattr(exc, "java_exception", None)
    seen = 0
    while java is not None and seen < 10:
        name = java.getClass().getName()
        if name.startswith("org.apache.iceberg.exceptions."):
            return name
        java, seen = java.getCause(), seen + 1
    java = getattr(exc, "java_exception", None)
    return java.getClass().getName() if java is not None else None


BAD_REQUEST = "org.apache.iceberg.exceptions.BadRequestException"
# Attempts of a staging write that a REST catalog refused for the sequence-number race below.
STAGE_WRITE_ATTEMPTS = 4


def sequence_number_race(exc: BaseException) -> bool:
    """A REST catalog refused a commit to a branch because a writer's commit to another branch took the
    sequence number the client had assigned: the server's `Cannot add snapshot with sequence number N older
    than last sequence number N` comes back as a 400 (BadRequestException), not the 409 a retry needs
    (apache/iceberg#15001, fixed server-side by #15126; SeaweedFS 4.48 answers so). The one place a
    message is read: the class alone names every malformed request. Writing again on the fresh table works."""
    if java_exception_class(exc) != BAD_REQUEST:
        return False
    java, seen = getattr(exc, "java_exception", None), 0
    while java is not None and seen < 10:
        if java.getClass().getName() == BAD_REQUEST:
            message = str(java.getMessage() or "")
            return "sequence number" in message and "last sequence number" in message
        java, seen = java.getCause(), seen + 1
    return False


COMMIT_FAILED = "org.apache.iceberg.exceptions.CommitFailedException"


def one_java_line(exc: BaseException) -> str:
    """The first line of the Java exception's own message (not its cause's), credentials masked."""
    java = getattr(exc, "java_exception", None)
    return one_line(java.getMessage() if java is not None else exc)


def java_root_message(exc: BaseException) -> str:
    """The first line of the root Java cause's message (what actually went wrong), else of `exc`."""
    java, root = getattr(exc, "java_exception", None), None
    for _ in range(20):
        if java is None:
            break
        root, java = java, java.getCause()
    text = str(root.getMessage() or root.getClass().getName()) if root is not None else str(exc)
    return one_line(text) or type(exc).__name__


def find_on_main(tbl, key: str, value: str):
    """The newest snapshot of `main`'s lineage whose summary has `key` = `value` (a Java Snapshot), or None."""
    snap = tbl.currentSnapshot()
    while snap is not None:
        if str(snap.summary().get(key)) == value:
            return snap
        parent = snap.parentId()
        snap = tbl.snapshot(parent) if parent is not None else None
    return None


def iterate_java(java_iterable):
    it = java_iterable.iterator()
    while it.hasNext():
        yield it.next()


def listed_java(jvm, java_iterable):
    """A Java iterable as a Python list, materialised on the Java side (one call, then one per item)."""
    items = java_class(jvm, GUAVA_LISTS).newArrayList(java_iterable)
    return [items.get(i) for i in range(items.size())]


def _with_files(update, method: str, files):
    """`update` with `method` (appendFile, addFile, deleteFile) called on it for each file."""
    for item in files:
        update = getattr(update, method)(item)
    return update


def _java_list(jvm, items):
    out = java_class(jvm, "java.util.ArrayList")()
    for item in items:
        out.add(item)
    return out


def is_interrupt(exc: BaseException) -> bool:
    """Ctrl-C (KeyboardInterrupt) or a run's termination (Dagster raises its own BaseException): not an error of the
    work, and possibly raised in the middle of a Py4J call."""
    return not isinstance(exc, Exception)


def drop_interrupted_call(spark) -> None:
    """Closes this thread's Py4J connection after an interrupt, so the next call opens a fresh one.

    An interrupt raised while a call waited for the JVM's answer leaves that answer unread on the thread's
    connection, and PySpark pins one connection per thread: the next call (the clean-up that removes a staging
    branch) would read the stale answer instead of its own and fail with nonsense (`KeyError: 'm'`). The JVM side
    of the call runs on to its end; nothing waits for it."""
    try:
        client = spark.sparkContext._gateway._gateway_client
        connection = client.get_thread_connection() if hasattr(client, "get_thread_connection") else None
        if connection is not None:
            connection.close(False)
    except Exception:  # no gateway (a stopped session): nothing to drop
        pass


@contextmanager
def dropping_interrupted_call(spark):
    """Inside the block an interrupt first drops the thread's Py4J connection (`drop_interrupted_call`), so whatever
    cleans up after it (a branch's removal, a task set's release) gets its own answers; then it goes on up."""
    try:
        yield
    except BaseException as exc:
        if is_interrupt(exc):
            drop_interrupted_call(spark)
        raise


def handle_swallowed_interrupts() -> None:
    """Python's report of an interrupt it dropped (raised inside a finalizer: "Exception ignored in ..." and a
    traceback) is replaced by what the interrupt needs: when the finalizer was Py4J's (it releases a Java object over
    the thread's connection), that connection is closed, since the aborted call's answer is still on it and the
    next call would read it (`KeyError: 'm'`); the interrupt itself is honoured at the run's next step boundary
    (`icemaint.safety.interrupts`). Any other unraisable exception is reported as before. Once per process."""
    import sys

    previous = sys.unraisablehook
    if getattr(previous, "icemaint", False):
        return

    def hook(unraisable) -> None:
        exc = unraisable.exc_value
        if exc is None or isinstance(exc, Exception):
            previous(unraisable)
            return
        if str(getattr(unraisable.object, "__module__", "") or "").startswith("py4j"):
            try:
                from pyspark.sql import SparkSession

                spark = SparkSession.getActiveSession()
                if spark is not None:
                    drop_interrupted_call(spark)
            except Exception:  # no session: no connection to drop
                pass

    hook.icemaint = True
    sys.unraisablehook = hook
