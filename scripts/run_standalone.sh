#!/usr/bin/env bash
# Run jobs/train.py on a throwaway Spark standalone cluster on this machine (a master and
# WORKERS workers started with spark-class, all bound to 127.0.0.1), as a cluster user would:
# the package shipped with --py-files, executors in their own JVMs and Python workers. The
# daemons are stopped at the end. Logs and the pyfiles zip go to $STANDALONE_DIR.
#   bash scripts/run_standalone.sh [TRAIN FLAGS...]
#   e.g. bash scripts/run_standalone.sh --input /work/scale/c1g --output RUN --vocab-size 32768
# Environment: WORKERS (2), WORKER_CORES (1), WORKER_MEMORY (3g), EXECUTOR_MEMORY (2g),
# MASTER_PORT (7177), STANDALONE_DIR (a new temporary directory).
set -euo pipefail
cd "$(dirname "$0")/.."
source .venv/bin/activate
export SPARK_LOCAL_IP=127.0.0.1 SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false"
workers=${WORKERS:-2} port=${MASTER_PORT:-7177}
dir=${STANDALONE_DIR:-$(mktemp -d -t spark-bpe-standalone-XXXXXX)}
mkdir -p "$dir"
spark_class=$(python -c "import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), 'bin', 'spark-class'))")
pids=()
stop() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap stop EXIT
# the daemons log at Spark's default level (INFO, to their files: this script waits on their
# lines), whatever SPARK_CONF_DIR the job itself gets (a quiet one hides those lines)
daemon=(env -u SPARK_CONF_DIR "$spark_class")  # execs java: $! is the daemon's pid
"${daemon[@]}" org.apache.spark.deploy.master.Master --host 127.0.0.1 --port "$port" \
    --webui-port 0 > "$dir/master.log" 2>&1 &
pids+=($!)
for _ in $(seq 60); do grep -q "I have been elected leader" "$dir/master.log" && break; sleep 1; done
grep -q "I have been elected leader" "$dir/master.log" || {
    echo "error: the Spark master did not start within 60 s; see $dir/master.log" >&2; exit 1; }
for i in $(seq 0 $((workers - 1))); do
    "${daemon[@]}" org.apache.spark.deploy.worker.Worker --host 127.0.0.1 --webui-port 0 \
        --cores "${WORKER_CORES:-1}" --memory "${WORKER_MEMORY:-3g}" --work-dir "$dir/work$i" \
        "spark://127.0.0.1:$port" > "$dir/worker$i.log" 2>&1 &
    pids+=($!)
done
for _ in $(seq 60); do
    [ "$(grep -c 'Registering worker' "$dir/master.log")" -ge "$workers" ] && break; sleep 1
done
[ "$(grep -c 'Registering worker' "$dir/master.log")" -ge "$workers" ] || {
    echo "error: not all $workers workers registered within 60 s; see $dir/worker*.log" >&2
    exit 1; }
bash scripts/build_pyfiles.sh "$dir/pyfiles.zip" > /dev/null
echo "standalone cluster spark://127.0.0.1:$port ($workers workers); logs in $dir" >&2
spark-submit --master "spark://127.0.0.1:$port" --conf spark.driver.host=127.0.0.1 \
    --conf "spark.executor.memory=${EXECUTOR_MEMORY:-2g}" --py-files "$dir/pyfiles.zip" \
    jobs/train.py "$@"
