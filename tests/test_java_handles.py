"""Java class handles without Py4J walking package paths (issue 20, item 2: fixed cost).

`jvm.org.apache.iceberg.X` asks the JVM about `org`, `org.apache`, ... in turn, each a failed class lookup
that searches every jar; PySpark's bare names (`functions`, `PythonUtils`) go through the view's star imports
the same way. `java_class` makes a handle once per gateway; `import_hot_classes` adds PySpark's names as single
imports. Both must name exactly the classes the slow paths found.
"""

from __future__ import annotations

from icemaint.engine.java import GUAVA_LISTS, PYSPARK_HOT_CLASSES, import_hot_classes, java_class


def test_a_handle_is_the_class_its_name_says_made_once_per_gateway(spark):
    jvm = spark._jvm
    handle = java_class(jvm, "java.util.ArrayList")
    assert java_class(jvm, "java.util.ArrayList") is handle
    made = handle()
    made.add(7)
    assert made.getClass().getName() == "java.util.ArrayList" and made.get(0) == 7
    copied = java_class(jvm, GUAVA_LISTS).newArrayList(made)  # a static method, as the package path gave it
    assert copied.size() == 1 and copied.getClass().getName() == jvm.java.util.ArrayList().getClass().getName()
    manager = java_class(jvm, "org.apache.iceberg.spark.ScanTaskSetManager").get()
    assert manager.equals(jvm.org.apache.iceberg.spark.ScanTaskSetManager.get())  # the same singleton


def test_pysparks_hot_names_are_single_imports_of_the_classes_they_name(spark):
    import_hot_classes(spark._jvm)
    imported = set(dir(spark._jvm))  # the view's single imports (its star imports are not listed)
    assert {fqn.rsplit(".", 1)[1] for fqn in PYSPARK_HOT_CLASSES} <= imported
    for fqn in PYSPARK_HOT_CLASSES:
        found = getattr(spark._jvm, fqn.rsplit(".", 1)[1])
        assert found._fqn == fqn and str(found._java_lang_class.getName()) == fqn  # a class that exists


def _jvm_sockets(spark) -> list:
    """The JVM's end of every open Py4J connection (read by reflection, as `answer_without_delay` does)."""
    jvm = spark._jvm
    field = jvm.java.lang.Class.forName("py4j.GatewayServer").getDeclaredField("connections")
    field.setAccessible(True)
    connections = jvm.java.util.ArrayList(field.get(spark.sparkContext._gateway.java_gateway_server))
    return [connections.get(i).getSocket() for i in range(connections.size())]


def test_the_jvm_answers_every_python_thread_without_nagles_delay(spark, config):
    """Py4J's Java side writes an answer longer than its 8 KiB buffer in several writes; with Nagle's algorithm the
    last one waited for an acknowledgement the Python side delays by up to 40 ms (a 9 KiB answer took 41-44 ms
    here, 0.1 ms without). `get_spark` sets TCP_NODELAY on the connection of each thread that asks for the
    session, including threads that did not make it (the tick runs tables' runs in threads)."""
    import threading

    from icemaint.engine.java import answer_without_delay
    from icemaint.engine.spark_session import get_spark

    for socket in _jvm_sockets(spark):  # as a fresh session's connections are
        socket.setTcpNoDelay(False)
    assert get_spark(config) is spark
    assert _jvm_sockets(spark) and all(s.getTcpNoDelay() for s in _jvm_sockets(spark))

    seen = {}

    def in_a_thread():
        spark._jvm.java.lang.System.nanoTime()  # this thread's own connection (Py4J's pinned threads)
        seen["before"] = len(_jvm_sockets(spark))
        get_spark(config)
        seen["all"] = all(s.getTcpNoDelay() for s in _jvm_sockets(spark))

    worker = threading.Thread(target=in_a_thread)
    worker.start()
    worker.join()
    assert seen == {"before": seen["before"], "all": True} and seen["before"] >= 2
    # a long answer arrives whole
    text = "1234567890:-987654321," * 1000
    assert spark._jvm.java.lang.StringBuilder(text).toString() == text
    assert answer_without_delay(spark._jvm, object()) == 0  # a gateway without a server list: nothing to set
