// One task: its attempts (and its compensator's), exit codes, reasons, times and logs; the
// attempts table is also the Finally section's.
import { useState } from "preact/hooks";
import { getJson, getText, paths, type Attempt, type TaskDetail } from "../api";
import { duration, time } from "../format";
import { useData } from "../hooks";
import { skipKind } from "../items";
import { ErrorNote, StateBadge } from "./Bits";

type Props = {
  namespace: string; run: string; task: string; version: string; onClose: () => void;
  /** For a forEach item: back to its task's items. */
  onUp?: () => void;
};

export function TaskPanel({ namespace, run, task, version, onClose, onUp }: Props) {
  const detail = useData(
    (signal) => getJson<TaskDetail>(paths.task(namespace, run, task), signal),
    [namespace, run, task, version],
  );
  const t = detail.data;
  return (
    <aside class="panel card" aria-labelledby="task-h" data-testid="task-panel" data-task={task}>
      <div class="panel-head">
        <h2 id="task-h">Task {task}</h2>
        <button type="button" class="link" onClick={onClose} aria-label="Close task details">Close</button>
      </div>
      {onUp && t?.forEach && (
        <p><button type="button" class="link" onClick={onUp}>← every item of {t.forEach}</button></p>
      )}
      <ErrorNote error={detail.error} />
      {t && (
        <>
          <dl class="facts">
            <dt>State</dt><dd><StateBadge state={t.state} skip={skipKind(t.state, t.reason)} /></dd>
            {t.forEach && (<><dt>Item</dt><dd>{t.item} <span class="muted">of {t.forEach}</span></dd></>)}
            <dt>Type</dt><dd>{t.type}</dd>
            <dt>Level</dt><dd>{t.level}</dd>
            <dt>Depends on</dt><dd>{t.dependsOn.length ? t.dependsOn.join(", ") : "—"}</dd>
            <dt>Exit code</dt><dd>{t.exitCode ?? "—"}</dd>
            <dt>Reason</dt><dd>{t.reason ?? "—"}{t.message ? <div class="muted small">{t.message}</div> : null}</dd>
            <dt>Started</dt><dd>{time(t.startedAt)}</dd>
            <dt>Finished</dt><dd>{time(t.finishedAt)}</dd>
            <dt>Duration</dt><dd>{duration(t.durationSeconds)}</dd>
            {t.compensator && (<><dt>Compensator</dt><dd>{t.compensator.type} <StateBadge state={t.compensator.state} /></dd></>)}
          </dl>
          <Attempts title="Attempts" attempts={t.attemptHistory} {...{ namespace, run, task }} compensator={false} />
          {t.compensatorAttempts.length > 0 && (
            <Attempts title="Compensator attempts" attempts={t.compensatorAttempts} {...{ namespace, run, task }} compensator />
          )}
        </>
      )}
    </aside>
  );
}

export function Attempts(props: { title: string; attempts: Attempt[]; namespace: string; run: string; task: string; compensator: boolean }) {
  const [open, setOpen] = useState<number | null>(null);
  return (
    <>
      <h3>{props.title}</h3>
      <table class="attempts">
        <thead><tr><th scope="col">#</th><th scope="col">State</th><th scope="col">Exit</th><th scope="col">Reason</th><th scope="col">Started</th><th scope="col">Took</th><th scope="col">Log</th></tr></thead>
        <tbody>
          {props.attempts.map((a) => (
            <tr key={a.number} data-attempt={a.number}>
              <td>{a.number}</td>
              <td><StateBadge state={a.state} /></td>
              <td>{a.exitCode ?? "—"}</td>
              <td title={a.message ?? undefined}>{a.reason ?? "—"}{a.message ? <div class="muted small">{a.message}</div> : null}</td>
              <td>{time(a.startedAt)}</td>
              <td>{duration(a.durationSeconds)}</td>
              <td><button type="button" class="link" aria-expanded={open === a.number} onClick={() => setOpen(open === a.number ? null : a.number)}>{open === a.number ? "Hide" : "Show"}</button></td>
            </tr>
          ))}
          {props.attempts.length === 0 && <tr><td colSpan={7} class="muted">No attempt yet.</td></tr>}
        </tbody>
      </table>
      {open !== null && <Log {...props} attempt={open} />}
    </>
  );
}

function Log({ namespace, run, task, attempt, compensator }: { namespace: string; run: string; task: string; attempt: number; compensator: boolean }) {
  const log = useData(
    (signal) => getText(`${paths.task(namespace, run, task)}/attempts/${attempt}/log${compensator ? "?compensator=true" : ""}`, signal),
    [namespace, run, task, attempt, compensator],
  );
  return (
    <div class="log" data-testid="log">
      <ErrorNote error={log.error} />
      {log.data !== undefined && <pre tabIndex={0} aria-label={`Log of attempt ${attempt}`}>{log.data || "(empty log)"}</pre>}
    </div>
  );
}
