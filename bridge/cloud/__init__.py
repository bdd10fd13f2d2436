"""What the cloud components share: the identity they act as (`identity`), how they reach a
storage account (`storage`), and how Azure Storage failures become bridge.retry's kinds
(`storageerrors`). The Azure SDKs load only when a component first needs them.

Nothing here reads the configuration: a component is handed its own settings (any object
with the attributes the protocols here name, such as config's sections) and an identity.
"""
