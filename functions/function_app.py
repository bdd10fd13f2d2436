"""The se-bridge consumer as an Azure Functions app (Python v2 programming model).

The Functions host loads this file; the logic is in the se-bridge package
(bridge/consumer/functionapp.py), installed from requirements.txt. The worker looks for exactly one
FunctionApp at module level: `app`.
"""

from pathlib import Path

from bridge.consumer.functionapp import ConsumerApp, build_app

# Relative paths in settings (such as SE_BRIDGE_CONSUMER_POLICY=policy.yaml) mean files
# deployed beside this one.
app = build_app(ConsumerApp(app_dir=Path(__file__).resolve().parent))
