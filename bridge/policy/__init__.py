"""The approval policy: the pure model and its evaluation (`model`), and the YAML policy file
that builds one (`file`). Used by the consumer and by the agent's local mode."""
