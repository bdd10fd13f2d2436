"""The benchmarks' own tests (test_*.py here) run with the suite; the benchmarks themselves
(`./dev bench`) take minutes, measure speed, and are never collected: pytest collects only
test_*.py files."""
