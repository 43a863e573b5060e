"""What a fresh Spark application's first jobs cost before any work: the fixed cost that a
short job (an encode of a few tens of MB) cannot spread.

    python scripts/bench_spark_start.py [--master local[2]] [--repeat 3]

Each repetition starts a fresh application in a fresh process (``--master``, loopback only)
and times, in order: a job with no Python in it (``JavaRDD.count`` over two elements: the
JVM's first scheduling, class loading, JIT), the same job again, a job with two Python tasks
(an identity map: the Python worker daemon and its workers start), and that job again. Prints
the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ONE_RUN = r"""
import json, time
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master(MASTER).config("spark.driver.host", "127.0.0.1")
         .config("spark.ui.enabled", "false").getOrCreate())
sc = spark.sparkContext
jl = sc._jvm.java.util.ArrayList()
for i in range(2):
    jl.add(i)
out = {}
for name in ("jvm_first", "jvm_again"):
    t = time.perf_counter(); sc._jsc.parallelize(jl, 2).count()
    out[name] = time.perf_counter() - t
for name in ("python_first", "python_again"):
    t = time.perf_counter(); sc.parallelize(range(2), 2).map(lambda x: x).collect()
    out[name] = time.perf_counter() - t
spark.stop()
print(json.dumps(out))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--master", default="local[2]")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    runs = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        r = subprocess.run([sys.executable, "-c", ONE_RUN.replace("MASTER", repr(args.master))],
                           capture_output=True, text=True, env=env, check=True)
        run = json.loads(r.stdout.strip().splitlines()[-1])
        run["process"] = time.perf_counter() - t
        runs.append(run)
    for key, what in (("jvm_first", "first job without Python (JVM only)"),
                      ("jvm_again", "the same job again"),
                      ("python_first", "then a first job with Python tasks"),
                      ("python_again", "the same job again"),
                      ("process", "the whole process (JVM start and stop included)")):
        values = [r[key] for r in runs]
        print(f"{what:50} median {statistics.median(values):6.2f} s   runs "
              + ", ".join(f"{v:.2f}" for v in values))
    return 0


if __name__ == "__main__":
    sys.exit(main())
