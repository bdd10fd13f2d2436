"""The policy's gates, one a module: each says whether an event may be approved now (None)
or the Verdict that stops it, and adds its lines to the explanation."""
