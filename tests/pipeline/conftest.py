"""One local[2] SparkSession for the whole test session (starting one takes seconds)."""

from __future__ import annotations

import os
import shutil

import pytest

from helpers import SPARK_TEST_JVM


@pytest.fixture(scope="session")
def spark():
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        pytest.skip("the Spark pipeline tests need Java 17+ (none found on PATH or in JAVA_HOME)")
    from chronos.pipeline.spark import session
    spark = session("local[2]", "chronos-tests", {"spark.sql.shuffle.partitions": "4", "spark.driver.memory": "1g",
                                                        "spark.driver.extraJavaOptions": SPARK_TEST_JVM})
    yield spark
    spark.stop()
