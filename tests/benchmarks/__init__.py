"""The benchmark suite (run on demand: `./dev bench`, never part of `pytest`)."""
