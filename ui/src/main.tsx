import { render } from "preact";
import { App } from "./App";
import "./style.css";
import { warmLayout } from "./useLayout";

warmLayout();
render(<App />, document.getElementById("app")!);
