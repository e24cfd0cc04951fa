"""The kopf side of FlowForge: admission webhooks and (later) the run operator."""
