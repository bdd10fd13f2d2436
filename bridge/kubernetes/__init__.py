"""Kubernetes nodes: the agent cordons and drains its own node before maintenance
(`[kubernetes]`, docs/kubernetes.md).

`plan` decides, purely, which pods a drain evicts, in what order, which it leaves and which
it waits for; `drain` carries a drain out (and the uncordon after) over the small `KubeApi`
of `api`; `client` is that API over lightkube, the only module that imports it, and only
when `[kubernetes]` is on. Nothing here reads the configuration or knows the agent.
"""
