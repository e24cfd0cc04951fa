// Definitions: the list per namespace, and one definition's versions, task types and graph.
import { useState } from "preact/hooks";
import { getJson, paths, type DefinitionDetail, type DefinitionList } from "../api";
import { ErrorNote, Section } from "../components/Bits";
import { Dag } from "../components/Dag";
import { NamespaceFilter, useNamespaces } from "../components/NamespaceFilter";
import { time } from "../format";
import { useData } from "../hooks";
import { href, navigate } from "../router";

export function DefinitionsPage({ search }: { search: URLSearchParams }) {
  const namespaces = useNamespaces();
  const namespace = search.get("namespace") ?? namespaces.names[0] ?? "";
  const defs = useData(
    (signal) => (namespace ? getJson<DefinitionList>(paths.definitions(namespace), signal) : Promise.resolve({ items: [] })),
    [namespace],
  );
  return (
    <section>
      <h1>Definitions</h1>
      <form class="filters" onSubmit={(e) => e.preventDefault()}>
        <NamespaceFilter namespaces={namespaces} value={namespace}
          onChange={(value) => navigate(href.definitions(`?namespace=${encodeURIComponent(value)}`), true)} />
      </form>
      <ErrorNote error={namespaces.error ?? defs.error} />
      <table data-testid="definitions">
        <thead><tr><th scope="col">Workflow</th><th scope="col">Newest version</th><th scope="col">Tasks</th><th scope="col">Fingerprint</th><th scope="col">Published</th></tr></thead>
        <tbody>
          {(defs.data?.items ?? []).map((d) => {
            const v = d.versions[0];
            return (
              <tr key={d.name}>
                <td><a href={href.definition(d.namespace, d.name)}>{d.name}</a></td>
                <td>{v ? `v${v.version}` : "—"} <span class="muted">({d.versions.length} versions)</span></td>
                <td>{v?.tasks ?? "—"}</td>
                <td><code title={v?.fingerprint}>{v?.fingerprint.slice(0, 12)}</code></td>
                <td>{time(v?.publishedAt)}</td>
              </tr>
            );
          })}
          {defs.data && defs.data.items.length === 0 && <tr><td colSpan={5} class="muted">No definitions here.</td></tr>}
        </tbody>
      </table>
    </section>
  );
}

export function DefinitionPage({ namespace, name }: { namespace: string; name: string }) {
  const def = useData((signal) => getJson<DefinitionDetail>(paths.definition(namespace, name), signal), [namespace, name]);
  const [chosen, setChosen] = useState<number | null>(null);
  const versions = def.data?.versions ?? [];
  const current = versions.find((v) => v.version === chosen) ?? versions[0];
  return (
    <section data-testid="definition">
      <p class="crumbs"><a href={href.definitions(`?namespace=${encodeURIComponent(namespace)}`)}>{namespace}</a> / definitions</p>
      <h1>{name}</h1>
      <ErrorNote error={def.error} />
      {versions.length > 0 && (
        <Section title="Versions" id="versions">
          <table>
            <thead><tr><th scope="col">Version</th><th scope="col">Fingerprint</th><th scope="col">Published</th><th scope="col">Tasks</th><th scope="col">Runs</th></tr></thead>
            <tbody>
              {versions.map((v) => (
                <tr key={v.version} class={v === current ? "current" : undefined} data-version={v.version}>
                  <td><button type="button" class="link" aria-pressed={v === current} onClick={() => setChosen(v.version)}>v{v.version}</button></td>
                  <td><code>{v.fingerprint}</code></td>
                  <td>{time(v.publishedAt)}</td>
                  <td>{v.graph.nodes.length}</td>
                  <td><a href={href.runs(`?namespace=${encodeURIComponent(namespace)}&workflow=${encodeURIComponent(name)}`)}>runs</a></td>
                </tr>
              ))}
            </tbody>
          </table>
        </Section>
      )}
      {current && (
        <>
          <Section title={`Task types of v${current.version}`} id="types">
            <table data-testid="task-types">
              <thead><tr><th scope="col">Type</th><th scope="col">Image</th><th scope="col">Command</th><th scope="col">Args</th></tr></thead>
              <tbody>
                {Object.entries(current.taskTypes).map(([type, t]) => (
                  <tr key={type}><td>{type}</td><td><code>{t.image}</code></td><td><code>{JSON.stringify(t.command ?? [])}</code></td><td><code>{JSON.stringify(t.args ?? [])}</code></td></tr>
                ))}
              </tbody>
            </table>
          </Section>
          <Section title={`Graph of v${current.version}`} id="def-graph">
            <Dag key={current.version} graph={current.graph} states={{}} />
            {current.graph.rollback.length > 0 && (
              <p>Rollback order: <strong>{current.graph.rollback.join(" → ")}</strong></p>
            )}
          </Section>
        </>
      )}
    </section>
  );
}
