// The run's finally tasks: the outcome they are told (the decided phase and how the rollback
// ended), whether they run now, and each one's state and attempts, in the order they run
// (one at a time, once the outcome is decided; none of them changes it).
import { useState } from "preact/hooks";
import type { Finally as FinallyView } from "../api";
import { duration, time } from "../format";
import { StateBadge } from "./Bits";
import { Attempts } from "./TaskPanel";

const ROLLBACK: Record<string, string> = {
  None: "nothing was rolled back",
  Completed: "the rollback completed",
  Halted: "the rollback halted",
};

function Told({ view }: { view: FinallyView }) {
  if (!view.outcome) {
    return <p class="muted">They run one at a time once the run's outcome is decided, and are told it.</p>;
  }
  const rollback = ROLLBACK[view.rollback ?? "None"] ?? view.rollback;
  return (
    <p>
      Told the outcome <strong data-testid="final-outcome">{view.outcome}</strong> ({rollback})
      {view.finalizing ? <>; running them now: the run takes {view.outcome} once the last has run.</> : "."}
    </p>
  );
}

export function Finally({ view, namespace, run }: { view: FinallyView; namespace: string; run: string }) {
  const [open, setOpen] = useState<string | null>(null);
  const shown = view.steps.find((s) => s.name === open);
  return (
    <div data-testid="finally" data-outcome={view.outcome ?? ""} data-rollback={view.rollback ?? ""}
      data-finalizing={view.finalizing ? "true" : "false"}>
      <Told view={view} />
      <table>
        <thead>
          <tr><th scope="col">#</th><th scope="col">Task</th><th scope="col">State</th><th scope="col">Attempts</th><th scope="col">Exit</th><th scope="col">Message</th><th scope="col">Started</th><th scope="col">Took</th></tr>
        </thead>
        <tbody>
          {view.steps.map((s, i) => (
            <tr key={s.name} data-step={s.name} data-state={s.state}>
              <td>{i + 1}</td>
              <td>
                <button type="button" class="link" aria-expanded={open === s.name} onClick={() => setOpen(open === s.name ? null : s.name)}>{s.name}</button>
                {" "}<span class="muted small">{s.type}</span>
              </td>
              <td><StateBadge state={s.state} /></td>
              <td>{s.attempts}</td><td>{s.exitCode ?? "—"}</td><td>{s.message ?? "—"}</td>
              <td>{time(s.startedAt)}</td><td>{duration(s.durationSeconds)}</td>
            </tr>
          ))}
        </tbody>
      </table>
      {shown && (
        <Attempts title={`Attempts of ${shown.name}`} attempts={shown.attemptHistory} namespace={namespace} run={run}
          task={shown.name} compensator={false} />
      )}
    </div>
  );
}
