"""Black-box agents: external agent programs run against the capture proxy (base.py)."""

import os

# litellm (under every agent here) otherwise tries to download its model cost map at import,
# retrying for seconds on a machine without network; its bundled copy is enough.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
