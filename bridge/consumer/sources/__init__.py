"""Where the consumer reads record batches from: Event Hubs, or a local hub directory."""
