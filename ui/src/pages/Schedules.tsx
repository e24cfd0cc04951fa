// Schedules: a namespace's WorkflowSchedules (next fire times, suspended, last fire), and one
// schedule with the runs it made, newest first, each linking to its run page.
import { useState } from "preact/hooks";
import { getJson, paths, type ScheduleDetail, type ScheduleList, type ScheduleSummary } from "../api";
import { ErrorNote, Phase, ProgressBar, Section } from "../components/Bits";
import { NamespaceFilter, useNamespaces } from "../components/NamespaceFilter";
import { time, until } from "../format";
import { useData, useNow } from "../hooks";
import { href, navigate } from "../router";

const POLL_MS = 5000;

function missedText(missed: Record<string, number>): string {
  const entries = Object.entries(missed).filter(([, n]) => n > 0);
  return entries.length ? entries.map(([reason, n]) => `${n} ${reason}`).join(", ") : "none";
}

function LastFire({ schedule }: { schedule: ScheduleSummary }) {
  const last = schedule.lastFire;
  if (!last) return <span class="muted">never</span>;
  return (
    <span data-testid="last-fire">
      {time(last.nominalTime)} · <a href={href.run(schedule.namespace, last.run)}>{last.run}</a>{" "}
      <Phase phase={last.phase ?? "Pending"} />
    </span>
  );
}

export function SchedulesPage({ search }: { search: URLSearchParams }) {
  const namespaces = useNamespaces();
  const namespace = search.get("namespace") ?? namespaces.names[0] ?? "";
  const now = useNow(5000);
  const listed = useData(
    (signal) => (namespace ? getJson<ScheduleList>(paths.schedules(namespace), signal) : Promise.resolve({ items: [] })),
    [namespace],
    POLL_MS,
  );
  const items = listed.data?.items ?? [];
  return (
    <section>
      <h1>Schedules</h1>
      <form class="filters" onSubmit={(e) => e.preventDefault()}>
        <NamespaceFilter namespaces={namespaces} value={namespace}
          onChange={(value) => navigate(href.schedules(`?namespace=${encodeURIComponent(value)}`), true)} />
        <span class="muted live" aria-live="polite">{listed.loading && !listed.data ? "Loading…" : `${items.length} shown · live`}</span>
      </form>
      <ErrorNote error={namespaces.error ?? listed.error} />
      <table class="runs" data-testid="schedules">
        <thead>
          <tr>
            <th scope="col">Schedule</th><th scope="col">Workflow</th><th scope="col">When</th>
            <th scope="col">Suspended</th><th scope="col">Next fire</th><th scope="col">Last fire</th>
            <th scope="col">Active</th><th scope="col">Missed</th>
          </tr>
        </thead>
        <tbody>
          {items.map((s) => (
            <tr key={s.uid} data-schedule={s.name} data-suspended={String(s.suspended)}>
              <td><a href={href.schedule(s.namespace, s.name)}>{s.name}</a></td>
              <td><a href={href.definition(s.namespace, s.workflow)}>{s.workflow}</a>{s.version != null && <span class="muted"> v{s.version}</span>}</td>
              <td><code>{s.schedule}</code> <span class="muted small">{s.timeZone}</span></td>
              <td>{s.suspended ? <strong>suspended</strong> : "no"}</td>
              <td data-testid="next-fire" title={s.nextFireTimes.map(time).join("\n")}>
                {s.nextFireTimes.length ? <>{time(s.nextFireTimes[0])} <span class="muted small">in {until(s.nextFireTimes[0], now)}</span></> : "—"}
              </td>
              <td><LastFire schedule={s} /></td>
              <td>{s.active.length}</td>
              <td>{missedText(s.missed)}</td>
            </tr>
          ))}
          {listed.data && items.length === 0 && <tr><td colSpan={8} class="muted">No schedules you may see in this namespace.</td></tr>}
        </tbody>
      </table>
    </section>
  );
}

export function SchedulePage({ namespace, name, search }: { namespace: string; name: string; search: URLSearchParams }) {
  const cursor = search.get("continue") ?? "";
  const [limit, setLimit] = useState(50);
  const query = new URLSearchParams({ limit: String(limit) });
  if (cursor) query.set("continue", cursor);
  const detail = useData(
    (signal) => getJson<ScheduleDetail>(`${paths.schedule(namespace, name)}?${query}`, signal),
    [namespace, name, query.toString()],
    POLL_MS,
  );
  const s = detail.data;
  return (
    <section data-testid="schedule">
      <p class="crumbs"><a href={href.schedules(`?namespace=${encodeURIComponent(namespace)}`)}>{namespace}</a> / schedules</p>
      <h1>{name} {s?.suspended && <span class="phase" data-testid="suspended">suspended</span>}</h1>
      <ErrorNote error={detail.error} />
      {!s && !detail.error && <p class="muted" role="status">Loading…</p>}
      {s && (
        <>
          <dl class="facts row">
            <dt>Workflow</dt><dd><a href={href.definition(namespace, s.workflow)}>{s.workflow}</a>{s.version != null ? ` v${s.version}` : " (newest)"}</dd>
            <dt>When</dt><dd><code>{s.schedule}</code> in {s.timeZone}</dd>
            <dt>Overlap</dt><dd>{s.overlapPolicy}</dd>
            <dt>Next fires</dt><dd data-testid="next-fires">{s.nextFireTimes.length ? s.nextFireTimes.map(time).join(", ") : "none"}</dd>
            <dt>Last fire</dt><dd><LastFire schedule={s} /></dd>
            <dt>Active</dt><dd>{s.active.length ? s.active.map((run, i) => <>{i > 0 && ", "}<a key={run} href={href.run(namespace, run)}>{run}</a></>) : "none"}</dd>
            <dt>Missed</dt><dd>{missedText(s.missed)}</dd>
            {s.queued && <><dt>Waiting</dt><dd>{time(s.queued)}</dd></>}
          </dl>
          {s.conditions.length > 0 && (
            <p class="muted small">{s.conditions.map((c) => `${c.type}=${c.status}${c.reason ? ` (${c.reason}: ${c.message})` : ""}`).join(" · ")}</p>
          )}
          <Section title="Runs it made" id="schedule-runs">
            <table data-testid="schedule-runs">
              <thead>
                <tr><th scope="col">Nominal time</th><th scope="col">Run</th><th scope="col">Phase</th><th scope="col">Progress</th><th scope="col">Fired</th><th scope="col">Why</th></tr>
              </thead>
              <tbody>
                {s.runs.map((made) => (
                  <tr key={made.name} data-run={made.name} data-phase={made.run?.phase ?? ""}>
                    <td>{time(made.nominalTime)}</td>
                    <td><a href={href.run(namespace, made.name)}>{made.name}</a></td>
                    <td>{made.run ? <Phase phase={made.run.phase} compensating={made.run.compensating} /> : <span class="muted">not in the store (yet)</span>}</td>
                    <td>{made.run ? <ProgressBar progress={made.run.progress} /> : "—"}</td>
                    <td>{time(made.firedAt)}</td>
                    <td>{made.manual ? "triggered" : made.backfill ? `backfill ${made.backfill}` : "scheduled"}</td>
                  </tr>
                ))}
                {s.runs.length === 0 && <tr><td colSpan={6} class="muted">No runs yet.</td></tr>}
              </tbody>
            </table>
            {s.continue && (limit < 500 ? (
              <button type="button" onClick={() => setLimit(Math.min(limit + 50, 500))}>Show more</button>
            ) : (
              <a class="button" href={`${href.schedule(namespace, name)}?${new URLSearchParams({ continue: s.continue })}`}>Older runs</a>
            ))}
          </Section>
        </>
      )}
    </section>
  );
}
