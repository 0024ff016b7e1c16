import { render } from "preact";
import { App } from "./app";
import "./style.css";

const root = document.getElementById("app")!;
// The loading line is static HTML, shown until the script runs; Preact would render beside it.
root.textContent = "";
render(<App />, root);
