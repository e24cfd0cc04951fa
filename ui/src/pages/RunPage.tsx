// One run: its graph coloured by state and kept live from /stream (approval gates drawn as
// such, a forEach task as one node whose items a click lists, a condition-skipped task apart
// from one an upstream failure skipped), the rollback path, its finally tasks, a task's
// attempts and logs, conditions and events, cancel/retry and a person's actions (pause,
// recover a halted rollback, approve) as the signed-in user.
import { useEffect, useMemo, useRef, useState } from "preact/hooks";
import {
  ApiError, getJson, paths, post, readStream,
  type Compensation, type Condition, type Graph, type RunChange, type RunDetail, type RunSummary,
} from "../api";
import { ErrorNote, Phase, ProgressBar, Section, StateBadge } from "../components/Bits";
import { Dag, MAX_DRAWN, nodeView } from "../components/Dag";
import { Finally } from "../components/Finally";
import { ItemsPanel } from "../components/ItemsPanel";
import { Rollback } from "../components/Rollback";
import { RunActions } from "../components/RunActions";
import { TaskPanel } from "../components/TaskPanel";
import { duration, FINAL_PHASES, label, time } from "../format";
import { useData, useNow } from "../hooks";
import { countsText, itemsOf, skipKind, splitInstance, type Items } from "../items";
import { href, navigate } from "../router";

type Live = { run: RunSummary & { conditions: Condition[] }; states: Record<string, string>; compensation: Compensation };
type StreamState = "connecting" | "live" | "reconnecting" | "ended" | "closed";

const DETAIL_REFRESH_MS = 1000;
// how long the page re-reads the run for an action it sent to show up in the history
const ACTION_WAIT_MS = 60_000;

/** Follows the run's stream, reconnecting until the run is final; merges every change. */
function useRunStream(namespace: string, name: string, onChange: () => void, enabled: boolean) {
  const [live, setLive] = useState<Live | null>(null);
  const [status, setStatus] = useState<StreamState>("connecting");
  const [error, setError] = useState<Error | undefined>();
  const notify = useRef(onChange);
  notify.current = onChange;
  useEffect(() => {
    if (!enabled) return;
    const abort = new AbortController();
    let final = false;
    const apply = (change: RunChange, snapshot: boolean) => {
      final = FINAL_PHASES.has(change.run.phase);
      setLive((prev) => ({
        run: change.run,
        compensation: change.compensation,
        states: snapshot || !prev ? change.states : { ...prev.states, ...change.states },
      }));
      setStatus("live");
      setError(undefined);
      notify.current();
    };
    (async () => {
      let wait = 500;
      let missing = 0;
      while (!abort.signal.aborted) {
        try {
          await readStream(`${paths.run(namespace, name)}/stream`, {
            onSnapshot: (c) => apply(c, true),
            onChange: (c) => apply(c, false),
          }, abort.signal);
          wait = 500;
          if (final) {
            setStatus("ended");
            notify.current();
            return;
          }
        } catch (e) {
          if (abort.signal.aborted) return;
          setError(e as Error);
          if (e instanceof ApiError && (e.status === 401 || e.status === 403 || (e.status === 404 && ++missing > APPEAR_SECONDS))) {
            setStatus("closed");
            return;
          }
          wait = e instanceof ApiError && e.status === 404 ? 1000 : Math.min(wait * 2, 8000);
        }
        setStatus("reconnecting");
        await new Promise((r) => setTimeout(r, wait));
      }
    })();
    return () => abort.abort();
  }, [namespace, name, enabled]);
  return { live, status, error };
}

const APPEAR_SECONDS = 60;

/** A run just applied (or retried) is in the store a moment after its object: until then
 * the server answers 404, so the page asks again for a while before saying it is not there. */
async function untilFound<T>(load: () => Promise<T>, signal: AbortSignal, onWait: () => void): Promise<T> {
  for (let tries = 0; ; tries++) {
    try {
      return await load();
    } catch (e) {
      if (!(e instanceof ApiError && e.status === 404) || tries >= APPEAR_SECONDS || signal.aborted) throw e;
      onWait();
      await new Promise((r) => setTimeout(r, 1000));
    }
  }
}

export function RunPage(props: { namespace: string; name: string }) {
  return <RunView {...props} />;
}

function RunView({ namespace, name }: { namespace: string; name: string }) {
  const [version, setVersion] = useState(0);
  const lastRefresh = useRef(0);
  const pending = useRef<ReturnType<typeof setTimeout> | undefined>();
  // Events, attempts and task briefs are not in the stream's changes: re-read the run,
  // at most once a second, after each change.
  const refresh = () => {
    if (pending.current) return;
    const due = Math.max(0, lastRefresh.current + DETAIL_REFRESH_MS - Date.now());
    pending.current = setTimeout(() => {
      pending.current = undefined;
      lastRefresh.current = Date.now();
      setVersion((v) => v + 1);
    }, due);
  };
  useEffect(() => () => clearTimeout(pending.current), []);

  const [waiting, setWaiting] = useState(false);
  const wait = () => setWaiting(true);
  // The graph first, drawn, then the rest: it is what the page is for, and on a big run each
  // of the other answers is built from (and parsed as) the whole graph too.
  const graph = useData(
    (signal) => untilFound(() => getJson<Graph>(`${paths.run(namespace, name)}/graph`, signal), signal, wait),
    [namespace, name],
  );
  const [drawn, setDrawn] = useState(false);
  const graphDone = drawn || graph.error !== undefined;
  const detail = useData(
    (signal) => untilFound(() => getJson<RunDetail>(paths.run(namespace, name), signal), signal, wait),
    [namespace, name, version],
    undefined,
    graphDone,
  );
  const stream = useRunStream(namespace, name, refresh, graphDone);
  const [selected, setSelected] = useState<string | null>(null);
  const [level, setLevel] = useState<number | null>(null);

  const d = detail.data;
  // A final run's stream has ended, but a person's action (a recovered rollback) still
  // changes it: from then on the run's detail, re-read, is the newer word.
  const streamDone = stream.status === "ended" || stream.status === "closed";
  const run = stream.live?.run ?? d;
  const compensation = (streamDone ? d?.compensation : undefined) ?? stream.live?.compensation ?? d?.compensation;
  const conditions = stream.live?.run.conditions ?? d?.conditions ?? [];
  const states = useMemo(() => {
    const fromDetail: Record<string, string> = {};
    for (const t of d?.tasks ?? []) {
      fromDetail[t.name] = t.state;
      if (t.compensator?.name) fromDetail[t.compensator.name] = t.compensator.state;
    }
    if (!stream.live) return fromDetail;
    return streamDone ? { ...stream.live.states, ...fromDetail } : stream.live.states;
  }, [stream.live, d, streamDone]);
  const items = useMemo(() => itemsOf(states), [states]);

  // After an action is sent, and while a final run's rollback runs again, re-read the run.
  const [expecting, setExpecting] = useState<{ name: string; until: number } | null>(null);
  const seen = expecting !== null && (d?.actions ?? []).some((a) => a.name === expecting.name);
  const recovering = streamDone && compensation?.state === "Running";
  useEffect(() => {
    if (seen) setExpecting(null);
    const waiting = expecting !== null && !seen && Date.now() < expecting.until;
    if (!waiting && !recovering) return;
    const timer = setTimeout(() => setVersion((v) => v + 1), DETAIL_REFRESH_MS);
    return () => clearTimeout(timer);
  }, [d, expecting, seen, recovering]);

  if (!run && !graph.data) {
    const error = graph.error ?? detail.error;
    return (
      <section>
        <h1>Run {namespace}/{name}</h1>
        {error ? <ErrorNote error={error} /> : (
          <p class="muted" role="status">{waiting ? "Waiting for the operator to record this run…" : "Loading…"}</p>
        )}
      </section>
    );
  }
  const select = (task: string) => { setSelected(task); setLevel(null); };
  // a forEach task with items opens as its list of items; an item (task[item]) as a task
  const [selectedTask, selectedItem] = selected ? splitInstance(selected) : [null, null];
  const group = selected && graph.data?.nodes.some((n) => n.id === selected && n.forEach) ? items.get(selected) : undefined;
  return (
    <section class="run" data-testid="run" data-phase={run?.phase ?? ""}>
      <div class="run-head">
        <div>
          <p class="crumbs"><a href={href.runs(`?namespace=${encodeURIComponent(namespace)}`)}>{namespace}</a> / runs</p>
          <h1>
            {name} {run && <Phase phase={run.phase} compensating={run.compensating} />}
            {d?.paused && !FINAL_PHASES.has(run?.phase ?? "") && <span class="phase ph-Queued">paused</span>}
          </h1>
          {run && (
            <p class="muted">
              <a href={href.definition(namespace, run.workflow)}>{run.workflow}</a> v{run.version}
              {d?.retryOf && <> · retry of <a href={href.run(namespace, d.retryOf)}>{d.retryOf}</a></>}
              {run.queue && <> · {run.queue.reason}: {run.queue.message}</>}
            </p>
          )}
        </div>
        {run && <Actions namespace={namespace} name={name} phase={run.phase} />}
      </div>
      {run ? <RunFacts run={run} stream={stream.status} /> : <p class="muted" role="status">Loading the run…</p>}
      <ErrorNote error={stream.error && stream.status !== "live" ? stream.error : undefined} />
      <div class="run-body">
        <Section title="Graph" id="graph">
          <ErrorNote error={graph.error} />
          {graph.data ? (
            <Dag graph={graph.data} states={states} items={items} selected={selectedTask} triggeredBy={compensation?.triggeredBy}
              onSelect={select} onSelectLevel={(l) => { setLevel(l); setSelected(null); }} selectedLevel={level}
              onDrawn={() => setDrawn(true)} />
          ) : !graph.error && <p class="muted">Laying out the graph…</p>}
          <Legend />
        </Section>
        {selected && group && group.size > 0 && (
          <ItemsPanel task={selected} items={group} briefs={d?.tasks ?? []} onSelect={select} onClose={() => setSelected(null)} />
        )}
        {selected && !(group && group.size > 0) && (
          <TaskPanel namespace={namespace} run={name} task={selected} version={`${version}`} onClose={() => setSelected(null)}
            onUp={selectedItem !== null && selectedTask ? () => select(selectedTask) : undefined} />
        )}
        {level !== null && graph.data && (
          <LevelPanel graph={graph.data} level={level} states={states} items={items} onSelect={select} onClose={() => setLevel(null)} />
        )}
      </div>
      {compensation && (
        <Section title="Rollback" id="rollback-sec">
          <Rollback compensation={compensation} onSelect={select} />
        </Section>
      )}
      {d?.finally && (
        <Section title="Finally" id="finally-sec">
          <Finally view={d.finally} namespace={namespace} run={name} />
        </Section>
      )}
      {d && run && (
        <Section title="Actions" id="run-actions-sec">
          <RunActions namespace={namespace} name={name} actions={d.actions ?? []} paused={d.paused ?? false}
            final={FINAL_PHASES.has(run.phase)} compensation={compensation}
            awaiting={d.tasks.filter((t) => (states[t.name] ?? t.state) === "awaiting").map((t) => t.name)}
            onSent={(made) => setExpecting({ name: made.name, until: Date.now() + ACTION_WAIT_MS })} />
        </Section>
      )}
      <Section title="Conditions" id="conditions">
        <table data-testid="conditions">
          <thead><tr><th scope="col">Type</th><th scope="col">Status</th><th scope="col">Reason</th><th scope="col">Message</th><th scope="col">Since</th></tr></thead>
          <tbody>
            {conditions.map((c) => (
              <tr key={c.type} data-condition={c.type}><td>{c.type}</td><td>{c.status}</td><td>{c.reason ?? "—"}</td><td>{c.message ?? ""}</td><td>{time(c.lastTransitionTime)}</td></tr>
            ))}
            {conditions.length === 0 && <tr><td colSpan={5} class="muted">None yet.</td></tr>}
          </tbody>
        </table>
      </Section>
      {d && Object.keys(d.parameters).length > 0 && (
        <Section title="Parameters" id="parameters">
          <dl class="facts">{Object.entries(d.parameters).map(([k, v]) => <><dt key={`k${k}`}>{k}</dt><dd key={`v${k}`}><code>{JSON.stringify(v)}</code></dd></>)}</dl>
        </Section>
      )}
      {d && d.tasks.length > 0 && d.tasks.length <= MAX_DRAWN && (
        <Section title="Tasks" id="tasks">
          <table data-testid="tasks">
            <thead><tr><th scope="col">Task</th><th scope="col">State</th><th scope="col">Attempts</th><th scope="col">Exit</th><th scope="col">Reason</th><th scope="col">Took</th><th scope="col">Compensator</th></tr></thead>
            <tbody>
              {d.tasks.map((t) => (
                <tr key={t.name} data-task={t.name}>
                  <td><button type="button" class="link" onClick={() => select(t.name)}>{t.name}</button></td>
                  <td><StateBadge state={states[t.name] ?? t.state} skip={skipKind(states[t.name] ?? t.state, t.reason)} /></td>
                  <td>{t.attempts}</td><td>{t.exitCode ?? "—"}</td><td>{t.reason ?? "—"}</td><td>{duration(t.durationSeconds)}</td>
                  <td>{t.compensator ? <>{t.compensator.type} <StateBadge state={t.compensator.state} /></> : "—"}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </Section>
      )}
      <Section title="Events" id="events">
        <table data-testid="events" class="events">
          <thead><tr><th scope="col">At</th><th scope="col">Kind</th><th scope="col">Task</th><th scope="col">Message</th></tr></thead>
          <tbody>
            {(d?.events ?? []).map((e, i) => (
              <tr key={i}><td>{time(e.at)}</td><td>{e.kind}</td><td>{e.task ?? "—"}</td><td>{e.message}</td></tr>
            ))}
            {d && d.events.length === 0 && <tr><td colSpan={4} class="muted">No events.</td></tr>}
          </tbody>
        </table>
      </Section>
    </section>
  );
}

function RunFacts({ run, stream }: { run: RunSummary; stream: StreamState }) {
  const now = useNow();
  const running = run.startedAt && !run.finishedAt;
  const words: Record<StreamState, string> = {
    connecting: "connecting…", live: "live", reconnecting: "reconnecting…", ended: "final", closed: "not following",
  };
  return (
    <dl class="facts row">
      <dt>Progress</dt><dd><ProgressBar progress={run.progress} /></dd>
      <dt>Created</dt><dd>{time(run.createdAt)}</dd>
      <dt>Started</dt><dd>{time(run.startedAt)}</dd>
      <dt>Finished</dt><dd>{time(run.finishedAt)}</dd>
      <dt>Duration</dt><dd>{duration(run.durationSeconds ?? (running ? (now - Date.parse(run.startedAt!)) / 1000 : null))}</dd>
      <dt>Updates</dt><dd data-testid="stream" data-stream={stream} aria-live="polite">{words[stream]}</dd>
    </dl>
  );
}

function Actions({ namespace, name, phase }: { namespace: string; name: string; phase: string }) {
  const [confirming, setConfirming] = useState(false);
  const [busy, setBusy] = useState(false);
  const [message, setMessage] = useState<{ text: string; error: boolean } | null>(null);
  const final = FINAL_PHASES.has(phase);
  const act = async (what: "cancel" | "retry") => {
    setBusy(true);
    setMessage(null);
    try {
      const made = await post<{ namespace: string; name: string }>(`${paths.run(namespace, name)}/${what}`);
      if (what === "retry") navigate(href.run(made.namespace, made.name));
      else setMessage({ text: "Cancel requested: the run stops and rolls back what succeeded.", error: false });
    } catch (e) {
      setMessage({ text: `${what === "cancel" ? "Cancel" : "Retry"} refused: ${(e as Error).message}`, error: true });
    } finally {
      setBusy(false);
      setConfirming(false);
    }
  };
  return (
    <div class="actions">
      {!final && !confirming && <button type="button" class="danger" disabled={busy} onClick={() => setConfirming(true)}>Cancel run</button>}
      {!final && confirming && (
        <span role="group" aria-label="Confirm cancel">
          <button type="button" class="danger" disabled={busy} onClick={() => void act("cancel")}>Yes, cancel {name}</button>
          <button type="button" onClick={() => setConfirming(false)}>Keep running</button>
        </span>
      )}
      {(phase === "Failed" || phase === "Cancelled") && (
        <button type="button" disabled={busy} onClick={() => void act("retry")}>Retry</button>
      )}
      {message && <p role={message.error ? "alert" : "status"} class={message.error ? "error" : "muted"}>{message.text}</p>}
    </div>
  );
}

const LEGEND = ["waiting", "ready", "awaiting", "running", "succeeded", "failed", "skipped", "cancelled"];

function Legend() {
  return (
    <ul class="legend" aria-label="State colours">
      {LEGEND.map((s) => <li key={s}><StateBadge state={s} skip={s === "skipped" ? "upstream" : null} /></li>)}
      <li><StateBadge state="skipped" skip="condition" /></li>
    </ul>
  );
}

const LEVEL_LIST = 200;

function LevelPanel({ graph, level, states, items, onSelect, onClose }: {
  graph: Graph; level: number; states: Record<string, string>; items: Items; onSelect: (task: string) => void; onClose: () => void;
}) {
  const [filter, setFilter] = useState("");
  const tasks = useMemo(
    () => graph.nodes.filter((n) => n.level === level).map((n) => ({ n, ...nodeView(n, states, items) })),
    [graph, level, states, items],
  );
  const needle = filter.trim().toLowerCase();
  const shown = tasks.filter(({ n, state }) => !needle || n.id.includes(needle) || (state ?? "").includes(needle));
  return (
    <aside class="panel card" aria-labelledby="level-h" data-testid="level-panel">
      <div class="panel-head">
        <h2 id="level-h">Level {level}: {tasks.length.toLocaleString("en")} tasks</h2>
        <button type="button" class="link" onClick={onClose}>Close</button>
      </div>
      <label>Filter by name or state <input type="search" value={filter} onInput={(e) => setFilter((e.target as HTMLInputElement).value)} /></label>
      <ul class="tasklist">
        {shown.slice(0, LEVEL_LIST).map(({ n, state, counts, skip }) => (
          <li key={n.id}>
            <button type="button" class="link" onClick={() => onSelect(n.id)}>{n.id}</button>{" "}
            <StateBadge state={state} skip={skip} />
            {counts && <span class="muted small"> {countsText(counts)}</span>}
          </li>
        ))}
      </ul>
      {shown.length > LEVEL_LIST && <p class="muted small">and {(shown.length - LEVEL_LIST).toLocaleString("en")} more: filter to narrow ({label("waiting")}, a name…).</p>}
    </aside>
  );
}
