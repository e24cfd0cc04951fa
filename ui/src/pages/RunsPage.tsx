// The runs list: filters in the URL, refreshed every few seconds. Across namespaces a page
// may come back short (see paging.ts): the list reads on until it holds a page's worth, a
// few pages at most, then offers to look further from where it stopped.
import { useState } from "preact/hooks";
import { getJson, queryString, type RunList, type RunsQuery } from "../api";
import { ErrorNote, Phase, ProgressBar } from "../components/Bits";
import { NamespaceFilter, useNamespaces } from "../components/NamespaceFilter";
import { age, duration, KNOWN_PHASES } from "../format";
import { useData, useNow } from "../hooks";
import { collect } from "../paging";
import { href, navigate } from "../router";

const POLL_MS = 2000;

export function RunsPage({ search }: { search: URLSearchParams }) {
  const namespace = search.get("namespace") ?? "";
  const workflow = search.get("workflow") ?? "";
  const phase = search.get("phase") ?? "";
  const cursor = search.get("continue") ?? "";
  const [limit, setLimit] = useState(50);
  const now = useNow();
  const namespaces = useNamespaces();

  const query = new URLSearchParams();
  if (namespace) query.set("namespace", namespace);
  if (workflow) query.set("workflow", workflow);
  if (phase) query.set("phase", phase);
  const runs = useData(
    (signal) => {
      const read = (size: number, from: string | null) => {
        const asked: RunsQuery = { namespace, workflow, phase, limit: size, continue: from };
        return getJson<RunList>(`/runs${queryString(asked)}`, signal);
      };
      return collect(read, limit, cursor || null);
    },
    [query.toString(), cursor, limit],
    POLL_MS,
  );

  const setFilter = (key: string, value: string) => {
    const next = new URLSearchParams(query);
    if (value) next.set(key, value);
    else next.delete(key);
    const qs = next.toString();
    navigate(href.runs(qs ? `?${qs}` : ""), true);
  };

  const items = runs.data?.items ?? [];
  const more = runs.data?.continue ?? null;
  // the follow-ups ran out before a page's worth: where they stopped, the next view begins
  const short = more !== null && items.length < limit;
  const further = more === null ? "" : href.runs(`?${new URLSearchParams({ ...Object.fromEntries(query), continue: more })}`);
  return (
    <section>
      <h1>Runs</h1>
      <form class="filters" role="search" onSubmit={(e) => e.preventDefault()}>
        <NamespaceFilter namespaces={namespaces} value={namespace} anyLabel="all I may see"
          onChange={(value) => setFilter("namespace", value)} />
        <label>
          Workflow
          <input name="workflow" type="search" value={workflow} placeholder="any"
            onChange={(e) => setFilter("workflow", (e.target as HTMLInputElement).value.trim())} />
        </label>
        <label>
          Phase
          <select name="phase" value={phase} onChange={(e) => setFilter("phase", (e.target as HTMLSelectElement).value)}>
            <option value="">any</option>
            {KNOWN_PHASES.map((p) => <option key={p} value={p}>{p}</option>)}
          </select>
        </label>
        <span class="muted live" aria-live="polite">{runs.loading && !runs.data ? "Loading…" : `${items.length} shown · live`}</span>
      </form>
      <ErrorNote error={runs.error} />
      <table class="runs" data-testid="runs">
        <thead>
          <tr>
            <th scope="col">Namespace</th><th scope="col">Run</th><th scope="col">Workflow</th>
            <th scope="col">Phase</th><th scope="col">Progress</th><th scope="col">Age</th><th scope="col">Duration</th>
          </tr>
        </thead>
        <tbody>
          {items.map((run) => (
            <tr key={run.uid} data-run={`${run.namespace}/${run.name}`} data-phase={run.phase}>
              <td>{run.namespace}</td>
              <td><a href={href.run(run.namespace, run.name)}>{run.name}</a></td>
              <td><a href={href.definition(run.namespace, run.workflow)}>{run.workflow}</a> <span class="muted">v{run.version}</span></td>
              <td>
                <Phase phase={run.phase} compensating={run.compensating} />
                {run.queue && <div class="muted small">{run.queue.reason}{run.queue.position != null ? ` #${run.queue.position}` : ""}</div>}
              </td>
              <td><ProgressBar progress={run.progress} /></td>
              <td><time dateTime={run.createdAt ?? undefined}>{age(run.createdAt, now)}</time></td>
              <td>{duration(run.durationSeconds ?? (run.startedAt && !run.finishedAt ? (now - Date.parse(run.startedAt)) / 1000 : null))}</td>
            </tr>
          ))}
          {runs.data && items.length === 0 && (
            <tr><td colSpan={7} class="muted">No runs you may see match these filters.</td></tr>
          )}
        </tbody>
      </table>
      {short ? (
        <p class="muted" data-testid="runs-short">
          Fewer than {limit} shown: the rest may lie behind namespaces you may not read.{" "}
          <a class="button" href={further}>Load more</a>
        </p>
      ) : more !== null && (limit < 500 ? (
        <button type="button" onClick={() => setLimit(Math.min(limit + 50, 500))}>Show more</button>
      ) : (
        <a class="button" href={further}>Older runs</a>
      ))}
    </section>
  );
}
