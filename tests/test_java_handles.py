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
