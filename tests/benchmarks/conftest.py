"""Keep the normal `pytest` run away from the benchmarks: they take minutes and measure speed."""

collect_ignore_glob = ["*.py"]
