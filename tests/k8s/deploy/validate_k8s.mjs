// Validates Kubernetes objects against the Kubernetes OpenAPI schemas, as the npm package
// kubernetes-models carries them (one model per apiVersion and kind, each with its JSON schema).
//
//   node validate_k8s.mjs MODELS_DIR OBJECTS.json
//
// MODELS_DIR holds node_modules/kubernetes-models (fetch_k8s_models.sh); OBJECTS.json is an array of
// objects. Prints one line per object; exit status 1 when any is invalid, 2 on a usage error. Kinds
// the package does not carry (custom resources: ServiceMonitor, SecurityContextConstraints) are
// named as not checked.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [modelsDir, objectsPath] = process.argv.slice(2);
if (!modelsDir || !objectsPath) {
  console.error("usage: node validate_k8s.mjs MODELS_DIR OBJECTS.json");
  process.exit(2);
}
const root = join(modelsDir, "node_modules", "kubernetes-models");
const objects = JSON.parse(readFileSync(objectsPath, "utf8"));
let invalid = 0;
for (const object of objects) {
  const apiVersion = object.apiVersion ?? "";
  const kind = object.kind ?? "";
  const name = `${kind} ${object.metadata?.name ?? "?"}`;
  const file = join(root, ...apiVersion.split("/"), `${kind}.js`);
  if (!apiVersion || !kind || !existsSync(file)) {
    console.log(`not checked: ${name} (${apiVersion}: no schema in kubernetes-models)`);
    continue;
  }
  const model = (await import(pathToFileURL(file).href))[kind];
  try {
    new model(object).validate();
    console.log(`valid: ${name} (${apiVersion})`);
  } catch (error) {
    invalid += 1;
    console.log(`INVALID: ${name} (${apiVersion}): ${error.message}`);
  }
}
process.exit(invalid > 0 ? 1 : 0);
