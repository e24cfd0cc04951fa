// The shell: sign-in, the header, and the page of the current route.
import { useEffect, useState } from "preact/hooks";
import { ApiError, getJson } from "./api";
import { setToken, token } from "./auth";
import { DefinitionPage, DefinitionsPage } from "./pages/Definitions";
import { RunPage } from "./pages/RunPage";
import { RunsPage } from "./pages/RunsPage";
import { SchedulePage, SchedulesPage } from "./pages/Schedules";
import { href, interceptLinks, useLocation } from "./router";

type Who = { username: string; groups: string[] };
type Session = { state: "checking" } | { state: "out"; error?: string } | { state: "in"; who: Who };

export function App() {
  const [session, setSession] = useState<Session>({ state: "checking" });
  const { route, search } = useLocation();

  // Without a pasted token a proxy may be adding the user's own: whoami tells.
  const check = async () => {
    setSession({ state: "checking" });
    try {
      setSession({ state: "in", who: await getJson<Who>("/whoami") });
    } catch (e) {
      const hadToken = token() !== null;
      if (e instanceof ApiError && e.status === 401) setToken(null);
      setSession({
        state: "out",
        error: hadToken || !(e instanceof ApiError && e.status === 401) ? String((e as Error).message) : undefined,
      });
    }
  };
  useEffect(() => {
    void check();
  }, []);

  useEffect(() => {
    document.addEventListener("click", interceptLinks);
    return () => document.removeEventListener("click", interceptLinks);
  }, []);

  const signOut = () => {
    setToken(null);
    setSession({ state: "out" });
  };

  return (
    <>
      <a class="skip" href="#main">Skip to content</a>
      <header class="top">
        <a class="brand" href={href.runs()}>FlowForge</a>
        <nav aria-label="Main">
          <a href={href.runs()} aria-current={route.page.startsWith("run") ? "page" : undefined}>Runs</a>
          <a href={href.schedules()} aria-current={route.page.startsWith("schedule") ? "page" : undefined}>
            Schedules
          </a>
          <a href={href.definitions()} aria-current={route.page.startsWith("definition") ? "page" : undefined}>
            Definitions
          </a>
        </nav>
        {session.state === "in" && (
          <div class="who">
            <span data-testid="username" title={session.who.groups.join(", ")}>{session.who.username}</span>
            {token() && <button type="button" class="link" onClick={signOut}>Sign out</button>}
          </div>
        )}
      </header>
      <main id="main" tabIndex={-1}>
        {session.state === "checking" && <p class="muted">Checking who you are…</p>}
        {session.state === "out" && <SignIn error={session.error} onToken={(t) => { setToken(t); void check(); }} />}
        {session.state === "in" && <Page route={route} search={search} />}
      </main>
    </>
  );
}

function Page({ route, search }: ReturnType<typeof useLocation>) {
  switch (route.page) {
    case "runs":
      return <RunsPage search={search} />;
    case "run":
      return <RunPage key={`${route.namespace}/${route.name}`} namespace={route.namespace} name={route.name} />;
    case "schedules":
      return <SchedulesPage search={search} />;
    case "schedule":
      return <SchedulePage key={`${route.namespace}/${route.name}`} namespace={route.namespace} name={route.name} search={search} />;
    case "definitions":
      return <DefinitionsPage search={search} />;
    case "definition":
      return <DefinitionPage key={`${route.namespace}/${route.name}`} namespace={route.namespace} name={route.name} />;
    default:
      return (
        <section>
          <h1>Not found</h1>
          <p>Nothing lives at <code>{route.path}</code>. <a href={href.runs()}>See the runs.</a></p>
        </section>
      );
  }
}

function SignIn({ error, onToken }: { error?: string; onToken: (token: string) => void }) {
  const [value, setValue] = useState("");
  return (
    <section class="signin">
      <h1>Sign in</h1>
      <p>
        Paste a Kubernetes bearer token (for a ServiceAccount:{" "}
        <code>kubectl create token NAME -n NAMESPACE</code>). It stays in this tab only. You see
        exactly what Kubernetes lets that identity see.
      </p>
      <form
        onSubmit={(e) => {
          e.preventDefault();
          if (value.trim()) onToken(value.trim());
        }}
      >
        <label for="token">Token</label>
        <textarea id="token" name="token" rows={4} spellcheck={false} autoComplete="off"
          value={value} onInput={(e) => setValue((e.target as HTMLTextAreaElement).value)} />
        <button type="submit">Sign in</button>
      </form>
      {error && <p role="alert" class="error">{error}</p>}
    </section>
  );
}
