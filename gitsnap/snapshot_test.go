package gitsnap

import (
	"context"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
)

const (
	kubeconfigWithToken = `apiVersion: v1
kind: Config
clusters:
- name: homelab
  cluster: {server: "https://10.0.0.10:6443"}
users:
- name: admin
  user:
    token: not-a-real-token
contexts:
- name: admin@homelab
  context: {cluster: homelab, user: admin}
current-context: admin@homelab
`
	kubeconfigJSON = `{"apiVersion":"v1","kind":"Config","clusters":[],"users":[{"name":"a","user":{"client-key-data":"Zm9v"}}]}`
	// A kubeconfig without credentials (e.g. one relying on an external login) is harmless.
	kubeconfigNoCredentials = `apiVersion: v1
kind: Config
clusters:
- name: homelab
  cluster: {server: "https://10.0.0.10:6443"}
users:
- name: viewer
  user: {}
`
	talosconfigWithKey = `context: homelab
contexts:
  homelab:
    endpoints: [10.0.0.10]
    ca: Zm9v
    crt: Zm9v
    key: Zm9vLWtleQ==
`
	// The body is key material's shape (an OpenSSH key's first lines),
	// not a key.
	privateKey = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\nQyNTUxOQAAACBmb28gYmFyIGJhego=\n-----END OPENSSH PRIVATE KEY-----\n"
	// Mentions users and Config but is an ordinary manifest.
	configMap = `apiVersion: v1
kind: ConfigMap
metadata: {name: users}
data: {note: "Config for users"}
`
)

// fixtureFluxPath is the fixture's Flux path: the build reads infra/ only,
// so the servers serve the fixture although it withholds files elsewhere.
const fixtureFluxPath = "infra"

// fixture describes a work tree and what its snapshot must hold.
type fixture struct {
	dir string
	// included maps each path expected in the snapshot to its content
	// (symlink target for symlinks).
	included map[string]string
	// modes of included paths that are not plain files.
	modes map[string]filemode.FileMode
	// excluded maps each path that exists in the work tree but must not be in
	// the snapshot to the rule expected to exclude it ("" for ignored or
	// skipped paths).
	excluded map[string]string
	excludes []string
	protect  []string
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	requireGit(t)
	dir := t.TempDir()
	git(t, dir, "init", "-q", "-b", testRepoBranch)
	fx := fixture{
		dir:      dir,
		included: map[string]string{},
		modes:    map[string]filemode.FileMode{},
		excluded: map[string]string{},
		excludes: []string{"private/", "*.secret"},
		// Absolute, as config.Protected gives them (a relative path in
		// --protect is relative to the server's working directory).
		protect: []string{filepath.Join(dir, "var", "state"), filepath.Join(dir, "keys", "talos"), filepath.Join(dir, "creds", "token"), "/elsewhere/outside"},
	}
	add := func(rel, content string, perm os.FileMode) {
		writeFile(t, dir, rel, content, perm)
		fx.included[rel] = content
	}
	exclude := func(rel, content, rule string) {
		writeFile(t, dir, rel, content, 0o644)
		fx.excluded[rel] = rule
	}

	// Committed content.
	add(".gitignore", "*.log\nbuild/\n", 0o644)
	writeFile(t, dir, "README.md", "committed readme\n", 0o644)
	add("infra/kustomization.yaml", "resources: [app.yaml]\n", 0o644)
	add("infra/app.yaml", configMap, 0o644)
	add("scripts/run.sh", "#!/bin/sh\necho run\n", 0o755)
	fx.modes["scripts/run.sh"] = filemode.Executable
	if err := os.Symlink("infra/app.yaml", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	fx.included["link"] = "infra/app.yaml"
	fx.modes["link"] = filemode.Symlink
	writeFile(t, dir, "gone.txt", "deleted after the commit\n", 0o644)
	exclude("clusters/x/kubeconfig", kubeconfigWithToken, RuleKubeconfig)
	exclude(".talos/homelab/notes.txt", "talos notes\n", RuleTalosDir)
	exclude("secrets.yaml", "cluster: {secret: x}\n", RuleSecretsBundle)
	add("keep.log", "tracked although ignored\n", 0o644)
	git(t, dir, "add", ".")
	git(t, dir, "add", "-f", "keep.log")
	git(t, dir, "commit", "-q", "-m", "initial")

	// Uncommitted state of the work tree.
	add("README.md", "edited, not committed\n", 0o644)
	if err := os.Remove(filepath.Join(dir, "gone.txt")); err != nil {
		t.Fatal(err)
	}
	add("infra/new.yaml", "untracked: yes\n", 0o644)
	add("configs/cm.yaml", configMap, 0o644)
	add("configs/anon-kubeconfig.yaml", kubeconfigNoCredentials, 0o644)
	add("docs/age.md", "about age keys\n", 0o644)
	add("environment.env", "LOG_LEVEL=debug\nAWS_SECRET_ACCESS_KEY=\n", 0o644)
	exclude("build/out.bin", "ignored build output\n", "")
	exclude("debug.log", "ignored log\n", "")

	exclude("kubeconfig", kubeconfigWithToken, RuleKubeconfig)
	exclude("admin.kubeconfig", "anything\n", RuleKubeconfig)
	exclude("clusters/y/kubeconfig.age", "-----BEGIN AGE ENCRYPTED FILE-----\n", RuleKubeconfig)
	exclude("clusters/y/talosconfig.age", "-----BEGIN AGE ENCRYPTED FILE-----\n", RuleTalosconfig)
	exclude("configs/admin.yaml", kubeconfigWithToken, RuleKubeconfig)
	exclude("configs/admin.json", kubeconfigJSON, RuleKubeconfig)
	exclude("talosconfig", talosconfigWithKey, RuleTalosconfig)
	exclude("clusters/x/talosconfig", "anything\n", RuleTalosconfig)
	exclude("configs/talos.yaml", talosconfigWithKey, RuleTalosconfig)
	exclude(".talos/talosconfig", talosconfigWithKey, RuleTalosDir)
	exclude("ai/state/homelab/state.json", "{}\n", RuleStateDir)
	exclude("sub/ai/state/x.json", "{}\n", RuleStateDir)
	exclude("sub/secrets.yaml", "x: y\n", RuleSecretsBundle)
	exclude("key.age", "AGE-SECRET-KEY-1NOTREAL\n", RuleAgeKey)
	exclude("sub/keys.agekey", "AGE-SECRET-KEY-1NOTREAL\n", RuleAgeKey)
	exclude(".env", "TOKEN=x\n", RuleDotEnv)
	exclude("sub/.env", "TOKEN=x\n", RuleDotEnv)
	exclude(".env.local", "TOKEN=x\n", RuleDotEnv)
	exclude("id_ed25519", privateKey, RulePrivateKey)
	exclude("private/notes.txt", "configured exclude\n", RuleConfiguredExclude)
	exclude("a/b/c.secret", "configured exclude\n", RuleConfiguredExclude)

	// Secrets by content wherever they sit. Token-shaped strings are built
	// here so no literal token sits in the source.
	exclude("rendered_configs/controlplane.yaml", talosMachineConfig, RuleTalosMachineConfig)
	exclude("backup/cp-1.yaml", "---\napiVersion: v1alpha1\nkind: HostnameConfig\nhostname: cp-1\n---\n"+talosMachineConfig, RuleTalosMachineConfig)
	exclude("apps/db-secret.yaml", "apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\nstringData:\n  password: hunter2\n", RuleUnencryptedSecret)
	exclude("apps/all.yaml", configMap+"---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: db\ndata:\n  password: aHVudGVyMg==\n", RuleUnencryptedSecret)
	add("apps/db-secret.sops.yaml", "apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\nstringData:\n  password: ENC[AES256_GCM,data:abc,iv:def,tag:ghi,type:str]\nsops:\n  age:\n    - recipient: age1xyz\n  mac: ENC[AES256_GCM,data:m,iv:i,tag:t,type:str]\n  version: 3.9.0\n", 0o644)
	add("apps/empty-secret.yaml", "apiVersion: v1\nkind: Secret\nmetadata:\n  name: filled-by-a-controller\n", 0o644)
	add("docs/tokens.md", "GitHub tokens start with ghp_ and AWS keys with AKIA.\n", 0o644)
	exclude("notes/github.txt", "token = gh"+"p_"+strings.Repeat("A1b2", 9)+"\n", RuleTokenPrefix+"github")
	exclude("ci/aws.env.txt", "AWS_ACCESS_KEY_ID=AK"+"IA"+strings.Repeat("Q7", 8)+"\n", RuleTokenPrefix+"aws access key")
	exclude("ci/gitlab.txt", "gl"+"pat-"+strings.Repeat("x", 20)+"\n", RuleTokenPrefix+"gitlab")
	exclude("keys/age.txt", "# created: 2026-01-01\nAGE-SECRET-KEY-1"+strings.Repeat("Q", 58)+"\n", RuleTokenPrefix+"age secret key")

	// Encrypted files under names that usually hold plaintext secrets are
	// served: Flux decrypts them. The same names in plaintext are not.
	add("apps/secrets.yaml", sopsSecret, 0o644)
	add("apps/.env.prod", "DB_PASSWORD=ENC[AES256_GCM,data:abc,iv:def,tag:ghi,type:str]\nsops_age__list_0__map_recipient=age1xyz\nsops_mac=ENC[AES256_GCM,data:m,iv:i,tag:t,type:str]\nsops_version=3.11.0\n", 0o644)
	add("backups/notes.yaml.age", "age-encryption.org/v1\n-> X25519 abc\nxyz\n--- def\n\x00\x01", 0o644)
	exclude("apps/.env.half", "DB_PASSWORD=hunter2\nsops_mac=ENC[AES256_GCM,data:m,iv:i,tag:t,type:str]\n", RuleDotEnv)
	exclude("apps/other/secrets.yml", strings.Replace(sopsSecret, "  mac: ENC[AES256_GCM,data:m,iv:i,tag:t,type:str]\n", "", 1), RuleSecretsBundle)
	// The leak guard's bypasses: a Secret in a List, a sops block without
	// a MAC, plaintext left by encrypted_regex, a broken first document, a
	// Secret that does not parse, a large file.
	exclude("apps/list.yaml", "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: a}\n- apiVersion: v1\n  kind: Secret\n  metadata: {name: b}\n  stringData: {password: hunter2}\n", RuleUnencryptedSecret)
	exclude("apps/secretlist.json", `{"apiVersion":"v1","kind":"SecretList","items":[{"apiVersion":"v1","kind":"Secret","metadata":{"name":"b"},"data":{"p":"aHVudGVy"}}]}`, RuleUnencryptedSecret)
	exclude("apps/nomac.yaml", "apiVersion: v1\nkind: Secret\nmetadata: {name: db}\nstringData:\n  password: ENC[AES256_GCM,data:abc,iv:def,tag:ghi,type:str]\nsops:\n  version: 3.11.0\n", RuleUnencryptedSecret)
	exclude("apps/regex.yaml", strings.Replace(sopsSecret, "  token: ENC[AES256_GCM,data:t,iv:i,tag:g,type:str]", "  token: plaintext-left-by-encrypted-regex", 1), RuleUnencryptedSecret)
	exclude("apps/broken-first.yaml", "key: [unclosed\n---\napiVersion: v1\nkind: Secret\nmetadata: {name: db}\nstringData: {password: hunter2}\n", RuleUnencryptedSecret)
	exclude("apps/broken-secret.yaml", "apiVersion: v1\nkind: Secret\nstringData:\n  password: hunter2\n  other: [\n", RuleUnencryptedSecret)
	exclude("assets/big.yaml", configMap+"---\n# "+strings.Repeat("x", 1<<20)+"\n---\napiVersion: v1\nkind: Secret\nmetadata: {name: db}\nstringData: {password: hunter2}\n", RuleUnencryptedSecret)
	// kustomize secretGenerators: literals refuse the kustomization, a
	// plaintext input file refuses that file, an encrypted one is served.
	add("gen/kustomization.yaml", "secretGenerator:\n- name: db\n  files: [token=token.txt, sealed.yaml, app.env=creds.bin]\n  envs: [db.env, sealed.env]\n", 0o644)
	exclude("gen/token.txt", "hunter2\n", RuleSecretGenerator)
	exclude("gen/db.env", "PASSWORD=hunter2\n", RuleSecretGenerator)
	add("gen/sealed.env", "PASSWORD=ENC[AES256_GCM,data:abc,iv:def,tag:ghi,type:str]\nsops_mac=ENC[AES256_GCM,data:m,iv:i,tag:t,type:str]\n", 0o644)
	add("gen/sealed.yaml", "password: ENC[AES256_GCM,data:abc,iv:def,tag:ghi,type:str]\nsops:\n  mac: ENC[AES256_GCM,data:m,iv:i,tag:t,type:str]\n", 0o644)
	// kustomize-controller picks a file source's format by its key.
	add("gen/creds.bin", "A=ENC[AES256_GCM,data:abc,iv:def,tag:ghi,type:str]\nsops_mac=ENC[AES256_GCM,data:m,iv:i,tag:t,type:str]\n", 0o644)
	exclude("gen2/kustomization.yml", "secretGenerator:\n- name: db\n  literals: [password=hunter2]\n", RuleSecretGenerator)
	// A Talos secrets bundle is never served, encrypted or not.
	exclude("clusters/bundle.yaml", talosBundle, RuleTalosSecretsBundle)
	exclude("clusters/sealed/secrets.yaml", sopsTalosBundle, RuleTalosSecretsBundle)
	// The paths the config protects, wherever state.dir and talosDir point.
	exclude("var/state/homelab/state.json", "{}\n", RuleProtected)
	exclude("keys/talos/homelab/notes.txt", "notes\n", RuleProtected)
	exclude("creds/token", "s3cr3t\n", RuleProtected)
	exclude("creds/token.bak-20260101T000000Z", "s3cr3t\n", RuleProtected)
	add("creds/tokenizer.md", "a different file\n", 0o644)

	// What git serves and Flux applies although it looks like a secret:
	// values that are placeholders (a Helm chart's templates, Flux's
	// post-build variables, secret-store references, Jinja and makejinja
	// templates, empty values sops leaves unencrypted), Secrets shown in
	// documentation, and the objects beside a SOPS document.
	add("charts/app/Chart.yaml", "apiVersion: v2\nname: app\nversion: 1.0.0\n", 0o644)
	add("charts/app/templates/secret.yaml", "{{- if .Values.password }}\napiVersion: v1\nkind: Secret\nmetadata:\n  name: {{ include \"app.fullname\" . }}\ndata:\n  password: {{ .Values.password | b64enc }}\n{{- end }}\n", 0o644)
	add("charts/app/templates/quoted.yaml", "apiVersion: v1\nkind: Secret\nmetadata:\n  name: app\nstringData:\n  password: \"{{ .Values.password }}\"\n  {{- toYaml .Values.extra | nindent 2 }}\n", 0o644)
	add("apps/subst-secret.yaml", "apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\nstringData:\n  password: ${DB_PASSWORD}\n  url: postgres://app:${DB_PASSWORD}@db:5432/app\n", 0o644)
	add("apps/op-secret.yaml", "apiVersion: v1\nkind: Secret\nmetadata:\n  name: op\nstringData:\n  token: |-\n    op://kubernetes/1password/OP_CONNECT_TOKEN\n", 0o644)
	add("apps/empty.sops.yaml", strings.Replace(sopsSecret, "  token: ENC[AES256_GCM,data:t,iv:i,tag:g,type:str]", "  token: \"\"", 1), 0o644)
	add("mixed/secrets.yaml", sopsSecret+"---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: apps\n", 0o644)
	add("gen3/kustomization.yaml", "secretGenerator:\n- name: db\n  literals:\n  - password=${DB_PASSWORD}\n  - user=\n", 0o644)
	add("docs/secret-example.md", "# Secrets\n\n```yaml\napiVersion: v1\nkind: Secret\nstringData:\n  password: hunter2\n```\n", 0o644)
	add("docs/deploy-key.md", "```yaml\nidentity: |\n  -----BEGIN OPENSSH PRIVATE KEY-----\n      ...\n  -----END OPENSSH PRIVATE KEY-----\n```\n", 0o644)
	add("template/secret.sops.yaml.j2", "#% if dns.provider == 'cloudflare' %#\n---\napiVersion: v1\nkind: Secret\nstringData:\n  api-token: \"#{ dns.token }#\"\n#% endif %#\n", 0o644)
	add("template/grafana.sops.yaml.j2", "apiVersion: v1\nkind: Secret\nstringData:\n  admin-user: admin\n  admin-password: \"{{ grafana.password }}\"\n", 0o644)
	add("talos/talsecret.yaml", "cluster:\n  id: ${CLUSTER_ID}\n  secret: ${CLUSTER_SECRET}\nsecrets:\n  bootstraptoken: ${BOOTSTRAPTOKEN}\ntrustdinfo:\n  token: ${TRUSTDINFO_TOKEN}\ncerts:\n  os:\n    crt: ${CERT_OS_CRT}\n    key: ${CERT_OS_KEY}\n", 0o644)
	add("talos/cluster.yaml.j2", "version: v1alpha1\nmachine:\n  ca:\n    crt: op://kubernetes/talos/MACHINE_CA_CRT\n  token: op://kubernetes/talos/MACHINE_TOKEN\ncluster:\n  token: op://kubernetes/talos/CLUSTER_TOKEN\n", 0o644)
	add("setup/.env.sample", "export EMAIL=\"\"\nexport CF_API_KEY=\"\"\nDB_PASSWORD=\n", 0o644)
	// What holds a secret although it looked like a placeholder or sat
	// where no rule looked: a literal written by a template or as a
	// variable's default, a URL password beside a variable, an S3
	// credentials file with a self-hosted server's key, a backup of a
	// plaintext secrets.yaml, a post-quantum age identity.
	exclude("charts/app/templates/literal.yaml", "apiVersion: v1\nkind: Secret\ndata:\n  password: {{ \"hunter2\" | b64enc }}\n", RuleUnencryptedSecret)
	exclude("apps/default-secret.yaml", "apiVersion: v1\nkind: Secret\nstringData:\n  password: ${DB_PASSWORD:=changeme}\n", RuleUnencryptedSecret)
	exclude("apps/url-literal.yaml", "apiVersion: v1\nkind: Secret\nstringData:\n  url: postgres://app:hunter2@db:5432/${DB_NAME}\n", RuleUnencryptedSecret)
	exclude("backup/aws-credentials", "[default]\naws_access_key_id = homelabbackup\naws_secret_access_key = s3cr3tbackupkey # garage\n", RuleAWSCredentials)
	exclude("apps/secrets.yaml.bak-20261128T000000Z", "password: hunter2\n", RuleSecretsBundle)
	exclude("keys/pq.txt", "AGE-SECRET-KEY-PQ-1"+strings.Repeat("Q", 80)+"\n", RuleTokenPrefix+"age secret key")
	exclude("talos/controlplane.yaml.j2", talosMachineConfig, RuleTalosMachineConfig)
	// A literal secret beside a placeholder: Flux substitutes ${VAR} and
	// leaves the rest as written.
	leakSecret := func(value string) string {
		return "apiVersion: v1\nkind: Secret\nmetadata: {name: app}\nstringData:\n  value: '" + value + "'\n"
	}
	exclude("apps/jdbc.yaml", leakSecret("jdbc:postgresql://${DB_HOST}:5432/app?user=app&password=JdbcS3cretValue"), RuleUnencryptedSecret)
	exclude("apps/adonet.yaml", leakSecret("Server=${DB_HOST};Database=app;User Id=sa;Password=MssqlS3cretValue;"), RuleUnencryptedSecret)
	exclude("apps/registry.yaml", "apiVersion: v1\nkind: Secret\nmetadata: {name: reg}\ntype: kubernetes.io/dockerconfigjson\nstringData:\n  .dockerconfigjson: '{\"auths\":{\"${REGISTRY}\":{\"username\":\"bot\",\"password\":\"RegistryS3cretValue\"}}}'\n", RuleUnencryptedSecret)
	exclude("apps/webhook.yaml", leakSecret("https://discord.com/api/webhooks/1234567890/WebhookS3cretTokenValue?thread_id=${THREAD_ID}"), RuleUnencryptedSecret)
	exclude("gen4/kustomization.yaml", "secretGenerator:\n- name: db\n  literals:\n  - DSN=Server=${DB_HOST};User Id=sa;Password=GenLiteralS3cret;\n", RuleSecretGenerator)
	// Templates that write a literal wherever it stands; a bare $NAME.
	exclude("charts/app/templates/funcs.yaml", "apiVersion: v1\nkind: Secret\nmetadata: {name: app}\ndata:\n  a: {{ b64enc \"ChartFuncS3cretValue\" }}\n", RuleUnencryptedSecret)
	exclude("charts/app/templates/default.yaml", "apiVersion: v1\nkind: Secret\nmetadata: {name: app}\ndata:\n  b: {{ .Values.password | default \"ChartDefaultS3cret\" | b64enc }}\n", RuleUnencryptedSecret)
	exclude("charts/app/templates/printf.yaml", "apiVersion: v1\nkind: Secret\nmetadata: {name: app}\ndata:\n  c: {{ printf \"%s\" \"ChartPrintfS3cret\" | b64enc }}\n", RuleUnencryptedSecret)
	exclude("apps/dollar.yaml", "apiVersion: v1\nkind: Secret\nmetadata: {name: app}\nstringData: {password: $DollarS3cretValue}\n", RuleUnencryptedSecret)
	// A plaintext Secret in an inline patch, kustomize's and Flux's.
	exclude("patched/kustomization.yaml", "resources: [app.yaml]\npatches:\n- patch: |-\n    apiVersion: v1\n    kind: Secret\n    metadata: {name: db}\n    stringData:\n      password: PatchS3cretValue\n", RuleUnencryptedSecret)
	exclude("patched/json6902.yaml", "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\npatches:\n- target: {kind: Secret, name: db}\n  patch: |-\n    - op: add\n      path: /stringData/password\n      value: PatchS3cretValue\n", RuleUnencryptedSecret)
	exclude("clusters/home/apps.yaml", "apiVersion: kustomize.toolkit.fluxcd.io/v1\nkind: Kustomization\nmetadata: {name: apps, namespace: flux-system}\nspec:\n  path: ./apps\n  sourceRef: {kind: GitRepository, name: flux-system}\n  patches:\n  - patch: |\n      apiVersion: v1\n      kind: Secret\n      metadata: {name: db}\n      stringData: {password: FluxPatchS3cret}\n", RuleUnencryptedSecret)
	// A kubeconfig without kind: kubectl loads it all the same.
	exclude("configs/kindless.yaml", "clusters:\n- name: c\n  cluster: {server: \"https://10.0.0.10:6443\"}\nusers:\n- name: u\n  user: {token: KindlessS3cretToken}\ncontexts:\n- name: c\n  context: {cluster: c, user: u}\n", RuleKubeconfig)
	// A password in a HelmRelease's values; a compose env file.
	exclude("apps/pg-release.yaml", "apiVersion: helm.toolkit.fluxcd.io/v2\nkind: HelmRelease\nmetadata: {name: pg}\nspec:\n  values:\n    auth:\n      postgresPassword: HelmValuesS3cret\n", RuleHelmValues)
	exclude("compose/db.env", "POSTGRES_USER=app\nPOSTGRES_PASSWORD=ComposeEnvS3cret\n", RuleDotEnv)
	exclude("notes/slack.txt", "alerts go to https://hooks.slack.com/services/T0123ABCD/B0123ABCD/abcdefghijklmnopqrstuvwx\n", RuleTokenPrefix+"slack webhook")
	// What reads as a secret's name but takes its value from elsewhere:
	// an env entry whose valueFrom stands on the next lines (the AWS rule
	// read the next line as its value), secret references in values.
	add("apps/backup-release.yaml", "apiVersion: helm.toolkit.fluxcd.io/v2\nkind: HelmRelease\nmetadata: {name: backup}\nspec:\n  values:\n    env:\n      AWS_ACCESS_KEY_ID:\n        valueFrom:\n          secretKeyRef: {name: s3, key: id}\n      AWS_SECRET_ACCESS_KEY:\n        valueFrom:\n          secretKeyRef:\n            name: s3\n            key: secret\n    auth:\n      existingSecret: pg-auth\n      secretKeys: {adminPasswordKey: password}\n      password: ${PG_PASSWORD}\n", 0o644)
	add("apps/env-list.yaml", "apiVersion: helm.toolkit.fluxcd.io/v2\nkind: HelmRelease\nmetadata: {name: app}\nspec:\n  values:\n    env:\n    - name: AWS_SECRET_ACCESS_KEY\n      valueFrom:\n        secretKeyRef: {name: s3, key: secret}\n    - name: LOG_LEVEL\n      value: debug\n", 0o644)
	// Metadata, a Secret's name, a Grafana reference and a boolean under
	// secret-named keys; and a client secret written in values.
	add("apps/dns-release.yaml", "apiVersion: helm.toolkit.fluxcd.io/v2\nkind: HelmRelease\nmetadata: {name: dns}\nspec:\n  values:\n    podAnnotations:\n      secret.reloader.stakater.com/reload: dns-secret\n    envFromSecret: dns-secret\n    grafana.ini:\n      auth.generic_oauth:\n        client_secret: $__env{OIDC_CLIENT_SECRET}\n    env:\n      USE_ACCESS_TOKEN: \"true\"\n", 0o644)
	exclude("apps/oidc-release.yaml", "apiVersion: helm.toolkit.fluxcd.io/v2\nkind: HelmRelease\nmetadata: {name: oidc}\nspec:\n  values:\n    oidc:\n      clientSecret: oidcclientsecretvalue\n", RuleHelmValues)

	// A nested repository is its own project.
	nested := filepath.Join(dir, "vendor", "other")
	if err := os.MkdirAll(nested, 0o755); err != nil {
		t.Fatal(err)
	}
	git(t, nested, "init", "-q")
	exclude("vendor/other/file.txt", "nested repository\n", "")
	return fx
}

func (fx fixture) expectedExclusions() Exclusions {
	want := Exclusions{}
	for _, rule := range fx.excluded {
		if rule != "" {
			want[rule]++
		}
	}
	return want
}

func (fx fixture) build(t *testing.T) *Snapshot {
	t.Helper()
	snap, err := Build(context.Background(), BuildOptions{Dir: fx.dir, Branch: testRepoBranch, Excludes: fx.excludes, Protect: fx.protect, FluxPath: fixtureFluxPath, ServeWholeTree: true})
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	return snap
}

// snapshotFiles reads the snapshot's commit back: path → content and mode.
func snapshotFiles(t *testing.T, snap *Snapshot) (map[string]string, map[string]filemode.FileMode, *object.Commit) {
	t.Helper()
	c, err := object.GetCommit(snap.storage, snap.Hash)
	if err != nil {
		t.Fatalf("reading snapshot commit: %v", err)
	}
	files := map[string]string{}
	modes := map[string]filemode.FileMode{}
	iter, err := c.Files()
	if err != nil {
		t.Fatal(err)
	}
	err = iter.ForEach(func(f *object.File) error {
		s, err := f.Contents()
		files[f.Name] = s
		modes[f.Name] = f.Mode
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files, modes, c
}

func TestBuildTakesWorkTreeMinusExclusions(t *testing.T) {
	fx := newFixture(t)
	snap := fx.build(t)
	files, modes, commit := snapshotFiles(t, snap)

	if !maps.Equal(files, fx.included) {
		t.Errorf("snapshot files:\n got  %v\n want %v", sortedKeys(files), sortedKeys(fx.included))
		for p, want := range fx.included {
			if files[p] != want {
				t.Errorf("%s: got %q, want %q", p, files[p], want)
			}
		}
	}
	for p, m := range modes {
		want := fx.modes[p]
		if want == 0 {
			want = filemode.Regular
		}
		if m != want {
			t.Errorf("%s: mode %v, want %v", p, m, want)
		}
	}
	if snap.Files != len(fx.included) {
		t.Errorf("Files = %d, want %d", snap.Files, len(fx.included))
	}
	if want := fx.expectedExclusions(); !maps.Equal(snap.Excluded, want) {
		t.Errorf("Excluded = %v, want %v", snap.Excluded, want)
	}
	// Every withheld file is named with its rule, in path order.
	named := map[string]string{}
	for i, w := range snap.Withheld {
		named[w.Path] = w.Rule
		if i > 0 && snap.Withheld[i-1].Path >= w.Path {
			t.Errorf("Withheld not sorted: %s before %s", snap.Withheld[i-1].Path, w.Path)
		}
	}
	for p, rule := range fx.excluded {
		if rule != "" && named[p] != rule {
			t.Errorf("%s withheld as %q, want %q", p, named[p], rule)
		}
	}
	if len(named) != fx.expectedExclusions().Total() {
		t.Errorf("Withheld names %d files, want %d", len(named), fx.expectedExclusions().Total())
	}
	if snap.Skipped < 1 {
		t.Errorf("Skipped = %d, want the nested repository counted", snap.Skipped)
	}
	if len(commit.ParentHashes) != 0 {
		t.Errorf("snapshot commit has parents %v", commit.ParentHashes)
	}
	if !commit.Author.When.Equal(snapshotSignature.When) || commit.Author.Email != snapshotSignature.Email {
		t.Errorf("author = %v, want the fixed snapshot identity", commit.Author)
	}
	if ref, err := snap.storage.Reference("HEAD"); err != nil || ref.Target() != snap.Ref() {
		t.Errorf("HEAD = %v (%v), want symbolic to %s", ref, err, snap.Ref())
	}
	if got := snap.Revision(); got != "main@sha1:"+snap.Hash.String() {
		t.Errorf("Revision() = %q", got)
	}
}

func TestBuildIsDeterministic(t *testing.T) {
	fx := newFixture(t)
	first := fx.build(t)
	if again := fx.build(t); again.Hash != first.Hash {
		t.Fatalf("same tree twice: %s then %s", first.Hash, again.Hash)
	}

	// Metadata git does not record changes nothing.
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(filepath.Join(fx.dir, "README.md"), later, later); err != nil {
		t.Fatal(err)
	}
	if again := fx.build(t); again.Hash != first.Hash {
		t.Errorf("an mtime change altered the hash: %s -> %s", first.Hash, again.Hash)
	}

	// The same content elsewhere, cloned fresh, gives the same commit.
	copyDir := filepath.Join(t.TempDir(), "copy")
	if out, err := exec.Command("cp", "-a", fx.dir, copyDir).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}
	var protect []string
	for _, p := range fx.protect {
		protect = append(protect, strings.Replace(p, fx.dir, copyDir, 1))
	}
	other, err := Build(context.Background(), BuildOptions{Dir: copyDir, Branch: testRepoBranch, Excludes: fx.excludes, Protect: protect, FluxPath: fixtureFluxPath, ServeWholeTree: true})
	if err != nil {
		t.Fatal(err)
	}
	if other.Hash != first.Hash {
		t.Errorf("a copy of the tree gave %s, want %s", other.Hash, first.Hash)
	}

	// An edit gives a new hash; reverting it gives the old one back.
	readme := filepath.Join(fx.dir, "README.md")
	writeFile(t, fx.dir, "README.md", "edited again\n", 0o644)
	edited := fx.build(t)
	if edited.Hash == first.Hash {
		t.Fatalf("an edit kept the hash %s", first.Hash)
	}
	writeFile(t, fx.dir, "README.md", fx.included["README.md"], 0o644)
	if again := fx.build(t); again.Hash != first.Hash {
		t.Errorf("reverting the edit gave %s, want %s", again.Hash, first.Hash)
	}

	// The exec bit is content too.
	if err := os.Chmod(readme, 0o755); err != nil {
		t.Fatal(err)
	}
	if again := fx.build(t); again.Hash == first.Hash {
		t.Errorf("chmod +x kept the hash")
	}
	if err := os.Chmod(readme, 0o644); err != nil {
		t.Fatal(err)
	}

	// A new excluded file changes nothing; a new ordinary file does.
	writeFile(t, fx.dir, "deep/er/.env", "TOKEN=y\n", 0o600)
	if again := fx.build(t); again.Hash != first.Hash {
		t.Errorf("adding an excluded file changed the hash")
	}
	writeFile(t, fx.dir, "deep/er/new.yaml", "a: b\n", 0o644)
	if again := fx.build(t); again.Hash == first.Hash {
		t.Errorf("adding a file kept the hash")
	}

	// A different branch name publishes the same commit under another ref.
	if err := os.RemoveAll(filepath.Join(fx.dir, "deep")); err != nil {
		t.Fatal(err)
	}
	dev, err := Build(context.Background(), BuildOptions{Dir: fx.dir, Branch: "dev", Excludes: fx.excludes, Protect: fx.protect, FluxPath: fixtureFluxPath, ServeWholeTree: true})
	if err != nil {
		t.Fatal(err)
	}
	if dev.Hash != first.Hash || dev.Ref() != "refs/heads/dev" {
		t.Errorf("branch dev: %s %s, want %s refs/heads/dev", dev.Hash, dev.Ref(), first.Hash)
	}
}

func TestBuildHonoursGitIgnoreSources(t *testing.T) {
	fx := newFixture(t)
	before := fx.build(t)
	writeFile(t, fx.dir, "scratch/a.txt", "a\n", 0o644)
	writeFile(t, fx.dir, "infra/b.tmp", "b\n", 0o644)
	withScratch := fx.build(t)
	if withScratch.Hash == before.Hash {
		t.Fatal("untracked files did not change the snapshot")
	}
	// Patterns from info/exclude and from the default global excludes file
	// ($XDG_CONFIG_HOME/git/ignore) hide them again, as for git status.
	writeFile(t, fx.dir, ".git/info/exclude", "scratch/\n", 0o644)
	writeFile(t, os.Getenv("XDG_CONFIG_HOME"), "git/ignore", "*.tmp\n", 0o644)
	defer os.Remove(filepath.Join(os.Getenv("XDG_CONFIG_HOME"), "git", "ignore"))
	if status := git(t, fx.dir, "status", "--porcelain", "--untracked-files=all"); strings.Contains(status, "scratch/") || strings.Contains(status, "b.tmp") {
		t.Fatalf("git itself still lists the files:\n%s", status)
	}
	if got := fx.build(t); got.Hash != before.Hash {
		t.Errorf("ignored files changed the snapshot: %s, want %s", got.Hash, before.Hash)
	}
}

func TestBuildRejectsBadInput(t *testing.T) {
	requireGit(t)
	if _, err := Build(context.Background(), BuildOptions{Dir: t.TempDir()}); err == nil {
		t.Error("Build of a directory that is not a git repository succeeded")
	}
	fx := newFixture(t)
	if _, err := Build(context.Background(), BuildOptions{Dir: fx.dir, Branch: "bad..branch"}); err == nil {
		t.Error("Build with an invalid branch name succeeded")
	}
	if _, err := Build(context.Background(), BuildOptions{Dir: fx.dir, Excludes: []string{" "}}); err == nil {
		t.Error("Build with an empty exclude pattern succeeded")
	}
}

func TestExclusionsString(t *testing.T) {
	e := Exclusions{RuleKubeconfig: 2, RuleDotEnv: 1}
	if got, want := e.String(), "3 (.env: 1, kubeconfig: 2)"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if got := (Exclusions{}).String(); got != "0" {
		t.Errorf("empty String() = %q", got)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	ks := slices.Collect(maps.Keys(m))
	sort.Strings(ks)
	return ks
}

// sopsSecret is a Secret as `sops --encrypt` writes it (values and the MAC
// as ENC[...] strings; the ciphertexts are placeholders).
const sopsSecret = `apiVersion: v1
kind: Secret
metadata:
  name: db
stringData:
  password: ENC[AES256_GCM,data:abc,iv:def,tag:ghi,type:str]
  token: ENC[AES256_GCM,data:t,iv:i,tag:g,type:str]
sops:
  age:
    - recipient: age1xyz
  lastmodified: "2026-01-01T00:00:00Z"
  mac: ENC[AES256_GCM,data:m,iv:i,tag:t,type:str]
  version: 3.11.0
`

// talosBundle has the sections of a Talos secrets bundle (placeholders).
const talosBundle = `cluster:
  id: abc
  secret: c2VjcmV0
secrets:
  bootstraptoken: abcdef.0123456789abcdef
trustdinfo:
  token: abcdef.0123456789abcdef
certs:
  os:
    crt: LS0t
    key: LS0t
`

const sopsTalosBundle = `cluster:
  id: ENC[AES256_GCM,data:a,iv:b,tag:c,type:str]
  secret: ENC[AES256_GCM,data:a,iv:b,tag:c,type:str]
trustdinfo:
  token: ENC[AES256_GCM,data:a,iv:b,tag:c,type:str]
certs:
  os:
    crt: ENC[AES256_GCM,data:a,iv:b,tag:c,type:str]
    key: ENC[AES256_GCM,data:a,iv:b,tag:c,type:str]
sops:
  mac: ENC[AES256_GCM,data:m,iv:i,tag:t,type:str]
  version: 3.11.0
`

// talosMachineConfig is the shape of a Talos v1alpha1 machine config (the
// secrets are placeholders; what matters is the document's root).
const talosMachineConfig = `version: v1alpha1
debug: false
persist: true
machine:
  type: controlplane
  token: abcdef.0123456789abcdef
  ca:
    crt: LS0tLS1CRUdJTi
    key: LS0tLS1CRUdJTi
cluster:
  secret: c2VjcmV0
`

// TestBuildServesWhatGitHolds: a file under a filter attribute (git-crypt,
// LFS) is smudged in the work tree; the snapshot serves the cleaned blob
// git holds, and leaves the file out when the work tree no longer matches
// the index or the file was never added. The filter here is rot13 for
// both clean and smudge, configured as git-crypt's is (filter.<name>.clean
// and .smudge in the repository config).
func TestBuildServesWhatGitHolds(t *testing.T) {
	requireGit(t)
	dir := t.TempDir()
	git(t, dir, "init", "-q", "-b", testRepoBranch)
	git(t, dir, "config", "filter.rot13.clean", "tr a-zA-Z n-za-mN-ZA-M")
	git(t, dir, "config", "filter.rot13.smudge", "tr a-zA-Z n-za-mN-ZA-M")
	writeFile(t, dir, ".gitattributes", "*.crypt filter=rot13 diff=rot13\n", 0o644)
	writeFile(t, dir, "sub/.gitattributes", "plain.crypt -filter\n", 0o644)
	writeFile(t, dir, "vault.crypt", "password=hunter2\n", 0o644)
	writeFile(t, dir, "changed.crypt", "password=hunter2\n", 0o644)
	writeFile(t, dir, "sub/plain.crypt", "not filtered here\n", 0o644)
	git(t, dir, "add", ".")
	git(t, dir, "commit", "-q", "-m", "initial")
	if got := git(t, dir, "cat-file", "-p", "HEAD:vault.crypt"); got != "cnffjbeq=uhagre2\n" {
		t.Fatalf("git holds %q for vault.crypt; the test filter is not in effect", got)
	}
	writeFile(t, dir, "changed.crypt", "password=hunter3\n", 0o644)
	writeFile(t, dir, "new.crypt", "password=hunter4\n", 0o644)

	snap, err := Build(context.Background(), BuildOptions{Dir: dir, Branch: testRepoBranch, ServeWholeTree: true})
	if err != nil {
		t.Fatal(err)
	}
	files, _, _ := snapshotFiles(t, snap)
	want := map[string]string{
		".gitattributes":     "*.crypt filter=rot13 diff=rot13\n",
		"sub/.gitattributes": "plain.crypt -filter\n",
		"vault.crypt":        "cnffjbeq=uhagre2\n",
		"sub/plain.crypt":    "not filtered here\n",
	}
	if !maps.Equal(files, want) {
		t.Errorf("snapshot files = %q, want %q", files, want)
	}
	if got := snap.Excluded[RuleFiltered]; got != 2 {
		t.Errorf("Excluded = %v, want changed.crypt and new.crypt under %q", snap.Excluded, RuleFiltered)
	}
	// The real git CLI, cloning what gitsnap serves, reads the same bytes
	// a clone of the repository itself gives without the filter.
	if out := git(t, dir, "show", "HEAD:vault.crypt"); out != files["vault.crypt"] {
		t.Errorf("git show HEAD:vault.crypt = %q, snapshot serves %q", out, files["vault.crypt"])
	}
}

// TestBuildProtectsConfiguredPaths: absolute protected paths inside the tree
// are left out; one that is the tree itself refuses the build.
func TestBuildProtectsConfiguredPaths(t *testing.T) {
	requireGit(t)
	dir := t.TempDir()
	git(t, dir, "init", "-q", "-b", testRepoBranch)
	writeFile(t, dir, "infra/a.yaml", "a: b\n", 0o644)
	writeFile(t, dir, "custom-state/homelab/gitsnap-auth", "flux:0123456789abcdef0123\n", 0o600)
	writeFile(t, dir, "kube/admin.conf", "anything\n", 0o600)
	writeFile(t, dir, "kube/admin.conf.bak-20260101T000000.000000000Z", "anything\n", 0o600)
	snap, err := Build(context.Background(), BuildOptions{Dir: dir, ServeWholeTree: true, Protect: []string{
		filepath.Join(dir, "custom-state"), filepath.Join(dir, "kube", "admin.conf"), filepath.Join(t.TempDir(), "outside"),
	}})
	if err != nil {
		t.Fatal(err)
	}
	files, _, _ := snapshotFiles(t, snap)
	if want := []string{"infra/a.yaml"}; !slices.Equal(sortedKeys(files), want) {
		t.Errorf("snapshot files = %v, want %v", sortedKeys(files), want)
	}
	if snap.Excluded[RuleProtected] != 3 {
		t.Errorf("Excluded = %v, want 3 under %q", snap.Excluded, RuleProtected)
	}
	if _, err := Build(context.Background(), BuildOptions{Dir: dir, Protect: []string{dir}}); err == nil || !strings.Contains(err.Error(), "protected") {
		t.Errorf("Build of a protected tree: %v, want a refusal", err)
	}
}
