// The namespace filter of the list pages: the namespaces the user may list runs in, read a
// page at a time and only on demand (a cluster may hold 10,000): the first page when the
// page opens, the next on "More namespaces", or while a name typed into "Find namespace"
// sorts after the last one read (the API lists them by name).
import { useEffect, useRef, useState } from "preact/hooks";
import { getJson, queryString, type NamespaceList, type NamespacesQuery } from "../api";
import { collect } from "../paging";

const PAGE = 100;
/** The most pages one typed name reads before the user must ask for more. */
const MAX_SEEK_PAGES = 5;

type Read = { names: string[]; next: string | null; loading: boolean; error?: Error };
export type Namespaces = Read & { more: () => void };

export function useNamespaces(): Namespaces {
  const [state, setState] = useState<Read>({ names: [], next: null, loading: true });
  const abort = useRef<AbortController | null>(null);
  const busy = useRef(false);
  const load = (cursor: string | null) => {
    const signal = abort.current?.signal;
    if (busy.current || !signal) return;
    busy.current = true;
    setState((s) => ({ ...s, loading: true }));
    const read = (limit: number, from: string | null) => {
      const query: NamespacesQuery = { limit, continue: from };
      return getJson<NamespaceList>(`/namespaces${queryString(query)}`, signal);
    };
    collect(read, PAGE, cursor)
      .then(
        (page) => {
          if (signal.aborted) return;
          const names = page.items.map((item) => item.name);
          setState((s) => ({ names: [...s.names, ...names], next: page.continue, loading: false }));
        },
        (error: Error) => {
          if (!signal.aborted) setState((s) => ({ ...s, loading: false, error }));
        },
      )
      .finally(() => {
        busy.current = false;
      });
  };
  useEffect(() => {
    abort.current = new AbortController();
    load(null);
    return () => abort.current?.abort();
  }, []);
  return { ...state, more: () => state.next !== null && load(state.next) };
}

export function NamespaceFilter({ namespaces, value, onChange, anyLabel }: {
  namespaces: Namespaces;
  value: string;
  onChange: (namespace: string) => void;
  /** The label of the choice of no namespace; without it one must be chosen. */
  anyLabel?: string;
}) {
  const { names, next, loading, more } = namespaces;
  const [find, setFind] = useState("");
  const seeks = useRef(0);
  const last = names.length ? names[names.length - 1] : undefined;
  useEffect(() => {
    seeks.current = 0;
  }, [find]);
  useEffect(() => {
    const further = next !== null && (last === undefined || last < find);
    if (find && further && !loading && seeks.current < MAX_SEEK_PAGES) {
      seeks.current += 1;
      more();
    }
  }, [find, next, loading, last]);

  const shown = find ? names.filter((name) => name.startsWith(find)) : names;
  return (
    <>
      <label>
        Namespace
        <select name="namespace" value={value} onChange={(e) => onChange((e.target as HTMLSelectElement).value)}>
          {anyLabel !== undefined && <option value="">{anyLabel}</option>}
          {shown.map((name) => <option key={name} value={name}>{name}</option>)}
          {value && !shown.includes(value) && <option value={value}>{value}</option>}
        </select>
      </label>
      <label>
        Find namespace
        <input name="namespace-find" type="search" value={find} placeholder="name starts with" autoComplete="off"
          onInput={(e) => setFind((e.target as HTMLInputElement).value.trim())} />
      </label>
      {next !== null && (
        <button type="button" onClick={more} disabled={loading}>More namespaces</button>
      )}
      <span class="muted small" aria-live="polite" data-testid="namespaces-read">
        {loading ? "Reading namespaces…" : `${names.length} namespaces${next !== null ? " so far" : ""}`}
      </span>
    </>
  );
}
