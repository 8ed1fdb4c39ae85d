"""The benchmark suite runner (bench.suite) and the recorded results of real GPU runs."""
