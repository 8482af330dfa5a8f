"""Graph-construction time of a tf.compat.v1.train.Saver over N dynamic embeddings (one per feature, as the feature
columns build them): what every Estimator train / evaluate / export pays once per graph.

    .venv/bin/python tools/bench_saver_build.py --tables 26 --repeats 3
"""

import argparse
import json
import time

from bench_common import REPO_ROOT  # puts this checkout's tensorflow_ext first on sys.path
import tensorflow as tf

import tensorflow_ext as tf_ext


def build_seconds(tables, shards):
    with tf.Graph().as_default():
        for i in range(tables):
            tf_ext.get_dynamic_embedding("C%d" % i, 8, num_shards=shards)
        start = time.perf_counter()
        tf.compat.v1.train.Saver()
        return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=26)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    tf.compat.v1.disable_eager_execution()
    times = sorted(build_seconds(args.tables, args.shards) for _ in range(args.repeats))
    median = round(times[len(times) // 2], 3)
    print(json.dumps({"tables": args.tables, "shards": args.shards, "saver_build_s_median": median, "repo": REPO_ROOT}))


if __name__ == "__main__":
    main()
