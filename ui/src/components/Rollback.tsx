// The saga's rollback as its own path: the compensators in the order they ran (then the
// ones still to run), what started it, and the step that halted it.
import type { Compensation } from "../api";
import { time } from "../format";
import { StateBadge } from "./Bits";

export function Rollback({ compensation, onSelect }: { compensation: Compensation; onSelect?: (task: string) => void }) {
  if (compensation.state === "NotTriggered" && compensation.steps.length === 0) {
    return <p class="muted" data-testid="rollback" data-state="NotTriggered">No rollback: nothing was compensated.</p>;
  }
  return (
    <div class="rollback" data-testid="rollback" data-state={compensation.state}>
      <p>
        Rollback <strong>{compensation.state}</strong>
        {compensation.triggeredBy ? (
          <> — triggered by the failure of{" "}
            <button type="button" class="link" data-testid="triggered-by" onClick={() => onSelect?.(compensation.triggeredBy!)}>
              {compensation.triggeredBy}
            </button>
          </>
        ) : (
          <> — triggered by a cancel</>
        )}
        {compensation.haltedBy && (
          <> ; halted at <strong data-testid="halted-by">{compensation.haltedBy}</strong>, whose compensator failed</>
        )}
      </p>
      <ol class="path" aria-label="Compensators in the order they run">
        {compensation.steps.map((step) => (
          <li key={step.order} data-step={step.order} data-task={step.task} data-compensator={step.compensator}
            data-state={step.state} class={step.task === compensation.haltedBy ? "halted" : undefined}>
            <button type="button" class="step" onClick={() => onSelect?.(step.task)}>
              <span class="order">{step.order}</span>
              <span class="what"><strong>{step.compensator}</strong> <span class="muted">undoes {step.task}</span></span>
              <StateBadge state={step.state} />
              <span class="muted small">{step.startedAt ? time(step.startedAt) : "not started"}</span>
            </button>
          </li>
        ))}
      </ol>
    </div>
  );
}
