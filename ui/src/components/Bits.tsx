// Small pieces shared by the pages.
import type { ComponentChildren } from "preact";
import type { Progress } from "../api";
import { label, phaseClass, stateClass } from "../format";
import { SKIP_LABEL, SKIP_TITLE, type SkipKind } from "../items";

export function Phase({ phase, compensating }: { phase: string; compensating?: boolean }) {
  return (
    <span class={`phase ${phaseClass(phase)}`} data-phase={phase}>
      {phase}
      {compensating && <span class="rolling"> · rolling back</span>}
    </span>
  );
}

/** A state; a skipped task of the DAG also says why (`skip`: see items.ts). */
export function StateBadge({ state, skip }: { state: string | null | undefined; skip?: SkipKind | null }) {
  return (
    <span class={`badge ${stateClass(state)}${skip ? ` skip-${skip}` : ""}`} data-state={state ?? ""}
      data-skip={skip ?? undefined} title={skip ? SKIP_TITLE[skip] : undefined}>
      {label(state)}{skip ? ` · ${SKIP_LABEL[skip]}` : ""}
    </span>
  );
}

// `tolerated`: forEach items that failed within their task's tolerateFailures (not in
// `failed`: no failure of the run)
export function ProgressBar({ progress }: { progress: Progress }) {
  const total = Math.max(progress.total, 1);
  const parts: [keyof Progress, string][] = [
    ["succeeded", "st-succeeded"], ["tolerated", "st-tolerated"], ["failed", "st-failed"],
    ["running", "st-running"], ["cancelled", "st-cancelled"], ["skipped", "st-skipped"],
  ];
  const done = progress.succeeded + progress.tolerated + progress.failed + progress.skipped + progress.cancelled;
  return (
    <span class="progress" title={parts.map(([k]) => `${k} ${progress[k]}`).join(", ")}>
      <span class="bar" aria-hidden="true">
        {parts.map(([key, cls]) =>
          progress[key] > 0 ? <span key={key} class={cls} style={{ width: `${(100 * progress[key]) / total}%` }} /> : null,
        )}
      </span>
      <span class="count">{done}/{progress.total}</span>
    </span>
  );
}

export function ErrorNote({ error }: { error?: Error }) {
  return error ? <p role="alert" class="error">{error.message}</p> : null;
}

export function Section({ title, children, id }: { title: string; children: ComponentChildren; id?: string }) {
  return (
    <section class="card" aria-labelledby={id ? `${id}-h` : undefined} id={id}>
      <h2 id={id ? `${id}-h` : undefined}>{title}</h2>
      {children}
    </section>
  );
}
