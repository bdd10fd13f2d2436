#!/usr/bin/env node
// Checks KQL texts with Microsoft's own Kusto parser and semantic analyser
// (@kusto/language-service-next, Kusto.Language compiled to JavaScript) against table schemas
// given by the caller, so unknown columns, type errors and syntax errors are caught before deploy.
//
// Input (JSON on stdin):
//   {"schemas": {"workspace": {"SeBridgeRecords_CL": {"TimeGenerated": "datetime", ...}},
//                "dcr": {"source": {...}}},
//    "queries": [{"name": "infra/kql/alerts/approval-failed.kql", "schema": "workspace",
//                 "text": "SeBridgeRecords_CL | ..."}]}
// Output (JSON on stdout), one entry per query, in order:
//   [{"name": ..., "diagnostics": [{"severity": "Error", "code": "KS142", "message": ...,
//      "line": 3, "column": 12}], "columns": ["EventId:string", ...], "operators": ["where", ...], "functions": ["isempty", ...],
//     "scalarOperators": ["==", "and", ...], "letNames": [...], "sources": ["SeBridgeRecords_CL"]}]
// Exit code: 0 when the input was read (whatever the diagnostics say), 2 when it was unusable.
"use strict";

const path = require("path");
const fs = require("fs");

function loadKusto() {
  // The package sets globals (Bridge, System, Kusto) rather than exporting them.
  const root = path.join(__dirname, "..", "..", "node_modules", "@kusto", "language-service-next");
  require(path.join(root, "bridge.js"));
  require(path.join(root, "Kusto.Language.Bridge.js"));
  return Kusto.Language;
}

function globalsFor(K, tables) {
  const S = K.Symbols;
  const symbols = Object.entries(tables).map(([tableName, columns]) => {
    const cols = Object.entries(columns).map(([name, type]) => {
      const scalar = S.ScalarTypes.GetSymbol(type);
      if (!scalar) throw new Error(`column ${tableName}.${name}: unknown Kusto type ${type}`);
      return new S.ColumnSymbol(name, scalar, null, null, null, null);
    });
    return new S.TableSymbol.$ctor4(tableName, cols);
  });
  return K.GlobalState.Default.WithDatabase(new S.DatabaseSymbol.ctor("db", symbols));
}

function lineAndColumn(text, offset) {
  const before = text.slice(0, offset).split("\n");
  return { line: before.length, column: before[before.length - 1].length + 1 };
}

function diagnosticsOf(code, text) {
  return Bridge.toArray(code.GetDiagnostics()).map((d) => ({
    severity: String(d.Severity),
    code: d.Code,
    message: d.Message,
    ...lineAndColumn(text, d.Start),
  }));
}

// The result's columns ("name:type"), so callers can see what an alert or chart receives.
function resultColumns(K, code) {
  const type = code.ResultType;
  if (!(type instanceof K.Symbols.TableSymbol)) return [];
  return Bridge.toArray(type.Columns).map((c) => `${c.Name}:${c.Type.Name}`);
}

function tokenText(node) {
  const token = node.GetFirstToken();
  return token ? token.Text : "";
}

// What the query is made of, for the DCR transformation allow-list (checked by the caller).
function inventory(K, code) {
  const found = { operators: new Set(), functions: new Set(), scalarOperators: new Set(),
                  letNames: new Set(), sources: new Set() };
  K.Syntax.SyntaxElement.WalkNodes(code.Syntax, (node) => {
    const kind = System.Enum.toString(K.Syntax.SyntaxKind, node.Kind);
    if (kind.endsWith("Operator") || kind === "DataTableExpression") {
      found.operators.add(tokenText(node));
    } else if (kind === "FunctionCallExpression") {
      found.functions.add(node.Name.SimpleName);
    } else if (kind === "LetStatement") {
      found.letNames.add(node.Name.SimpleName);
    } else if (kind === "NameReference" && node.ReferencedSymbol instanceof K.Symbols.TableSymbol) {
      found.sources.add(node.SimpleName);
    }
    const op = node.Operator;
    if (op && typeof op.Text === "string") found.scalarOperators.add(op.Text);
  });
  return Object.fromEntries(Object.entries(found).map(([key, set]) => [key, [...set].sort()]));
}

function check(K, request) {
  const globals = {};
  for (const [name, tables] of Object.entries(request.schemas)) globals[name] = globalsFor(K, tables);
  return request.queries.map((query) => {
    const scope = globals[query.schema];
    if (!scope) throw new Error(`query ${query.name}: no schema named ${query.schema}`);
    const code = K.KustoCode.ParseAndAnalyze(query.text, scope);
    return { name: query.name, diagnostics: diagnosticsOf(code, query.text),
             columns: resultColumns(K, code), ...inventory(K, code) };
  });
}

function main() {
  let request;
  try {
    request = JSON.parse(fs.readFileSync(0, "utf8"));
  } catch (err) {
    process.stderr.write(`tools/kql/check.js: stdin is not a JSON request (${err.message})\n`);
    return 2;
  }
  try {
    process.stdout.write(JSON.stringify(check(loadKusto(), request)) + "\n");
  } catch (err) {
    process.stderr.write(`tools/kql/check.js: ${err.message}\n`);
    return 2;
  }
  return 0;
}

process.exitCode = main();
