"""A sharded ETL pipeline written with flowforge.sdk's chain, group and chord.

    extract -> (transform shard-1 | shard-2 | shard-3) -> merge -> (load-warehouse | load-search)
                                                                   -> notify

Print it as a manifest for a GitOps repository, or look at it:

    flowforge render examples/sdk_pipeline.py:pipeline > pipeline.yaml
    flowforge graph pipeline.yaml --format mermaid
"""

from __future__ import annotations

from typing import Any

from flowforge.sdk import chain, chord, group, task, workflow

SHARDS = ("shard-1", "shard-2", "shard-3")
STEP_TYPE: dict[str, Any] = {
    "image": "busybox:1.36",
    # a shard's config ({"shard": "shard-1"}) is the file $FLOWFORGE_CONFIG_FILE; a Python
    # task reads it with flowforge.sdk.task_config()
    "command": ["sh", "-c", 'echo "running $FLOWFORGE_TASK on $(cat "$FLOWFORGE_CONFIG_FILE")"'],
    "annotations": {"flowforge.io/simulate-duration": "1s"},
}


def pipeline() -> dict[str, Any]:
    """The WorkflowDefinition document of the pipeline."""
    transform_every_shard = group(
        *(
            task(f"transform-{shard}", "step", config={"shard": shard}, retries=2)
            for shard in SHARDS
        )
    )
    load_everywhere = group(
        task(
            "load-warehouse",
            "step",
            timeout_seconds=600,
            compensated_by=task("unload-warehouse", "step"),
        ),
        task("load-search", "step", compensated_by=task("unload-search", "step")),
    )
    return workflow(
        "sharded-etl",
        1,
        description="Extract once, transform three shards in parallel, load two stores",
        task_types={"step": STEP_TYPE},
        body=chain(
            task("extract", "step", config={"source": "s3://bucket/input"}),
            chord(transform_every_shard, task("merge", "step")),
            load_everywhere,
            task("notify", "step", config={"channel": "#data"}),
        ),
    )
