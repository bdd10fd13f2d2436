"""Notifications: the consumer tells people about events on webhooks (docs/people.md).

`Notice` is what happened (an event asked about, approved, held, timed out, overridden; the
fleet paused or resumed); `formats` turns one into the body a target takes (generic JSON,
Microsoft Teams workflows, Slack); `Notifier` posts them from threads of its own, retried with
the project's backoff, so a slow or failing webhook never holds the consumer up; `kinds` is the
one module that reads the settings (`[notify]`) and resolves the URLs, which are secrets.
"""
