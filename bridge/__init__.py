"""se-bridge: Azure Scheduled Events turned into fleet-wide records and decisions."""

__version__ = "0.1.0"
