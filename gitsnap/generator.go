package gitsnap

import (
	"os"
	"path"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"
)

// kustomizationNames are the file names kustomize reads a kustomization
// from (sigs.k8s.io/kustomize/api konfig.RecognizedKustomizationFileNames).
var kustomizationNames = map[string]bool{"kustomization.yaml": true, "kustomization.yml": true, "Kustomization": true}

// generatorInputs are what the tree's kustomize secretGenerators hold:
// kustomizations with literals (plaintext values in the file itself) and
// the files and env files the generators read.
type generatorInputs struct {
	literals map[string]bool
	// files maps each input to the sops format kustomize-controller
	// decrypts it as.
	files map[string]sopsFormat
}

// sopsFormat is a sops store format.
type sopsFormat int

const (
	formatYAMLOrJSON sopsFormat = iota // yaml, json and binary (stored as JSON)
	formatDotenv
	formatINI
)

// formatFor is the format kustomize-controller v1.9.5 decrypts a
// generator input as (internal/decryptor/decryptor.go formatForPath, on
// getsops/sops v3.11.0 cmd/sops/formats FormatForPath): by the suffix of
// name, .env dotenv, .ini INI, everything else YAML/JSON or binary, which
// sops stores as JSON too; an env source whose name gives binary is read
// as dotenv.
func formatFor(name string, env bool) sopsFormat {
	switch {
	case strings.HasSuffix(name, ".env"):
		return formatDotenv
	case strings.HasSuffix(name, ".ini"):
		return formatINI
	case env && !strings.HasSuffix(name, ".yaml") && !strings.HasSuffix(name, ".yml") && !strings.HasSuffix(name, ".json"):
		return formatDotenv
	}
	return formatYAMLOrJSON
}

// secretGeneratorInputs reads every kustomization among the candidates.
// One that does not parse names nothing: kustomize refuses it too.
func secretGeneratorInputs(root string, candidates []string) generatorInputs {
	g := generatorInputs{literals: map[string]bool{}, files: map[string]sopsFormat{}}
	for _, p := range candidates {
		if !kustomizationNames[path.Base(p)] {
			continue
		}
		data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(p)))
		if err != nil {
			continue
		}
		var k struct {
			SecretGenerator []struct {
				Literals []string `yaml:"literals"`
				Files    []string `yaml:"files"`
				Envs     []string `yaml:"envs"`
				Env      string   `yaml:"env"`
			} `yaml:"secretGenerator"`
		}
		if yaml.Unmarshal(data, &k) != nil {
			continue
		}
		dir := path.Dir(p)
		for _, sg := range k.SecretGenerator {
			for _, l := range sg.Literals {
				// "KEY=value" (kustomize api kv.go parseLiteralSource);
				// a placeholder value holds no secret.
				if _, v, _ := strings.Cut(l, "="); !holdsNoSecret(unquote(strings.TrimSpace(v))) {
					g.literals[p] = true
				}
			}
			add := func(file string, format sopsFormat) {
				rel := path.Clean(path.Join(dir, file))
				if rel != ".." && !strings.HasPrefix(rel, "../") {
					g.files[rel] = format
				}
			}
			for _, f := range sg.Files {
				// "[key=]path": kustomize-controller picks the format by
				// the key (the path when there is none).
				key, file, ok := strings.Cut(f, "=")
				if !ok {
					file = key
				}
				add(file, formatFor(key, false))
			}
			// The deprecated env (singular) is an input kustomize reads
			// too (FixKustomization moves it into envs), so a plaintext
			// one is withheld like any. kustomize-controller v1.9.5 does
			// not decrypt it (decryptKustomizationSources reads a plain
			// unmarshal's EnvSources only; kustomize api v0.21.1
			// kvpairsources.go keeps it in EnvSource): an encrypted one
			// is served and reaches the cluster as ciphertext, as with
			// git (docs/fidelity.md).
			envs := sg.Envs
			if sg.Env != "" {
				envs = append(envs, sg.Env)
			}
			for _, f := range envs {
				add(f, formatFor(f, true))
			}
		}
	}
	return g
}

// judge returns RuleSecretGenerator for a kustomization with a literal
// value and for a generator input that is neither SOPS-encrypted in the
// format kustomize-controller decrypts it as (decryptKustomizationSources
// visits every FileSources and EnvSources entry) nor made of placeholders
// only: an encrypted input is decrypted before kustomize reads it, and a
// placeholder holds no secret, so both are served.
func (g generatorInputs) judge(p string, data []byte) string {
	if g.literals[p] {
		return RuleSecretGenerator
	}
	format, ok := g.files[p]
	if !ok {
		return ""
	}
	var sealed bool
	switch format {
	case formatDotenv:
		sealed = sopsDotenvSealed(data)
	case formatINI:
		sealed = sopsINISealed(data)
	default:
		sealed = sopsSealed(data)
	}
	if sealed {
		return ""
	}
	if format == formatDotenv && dotenvHoldsNoSecret(data) || format != formatDotenv && holdsNoSecret(string(data)) {
		return ""
	}
	return RuleSecretGenerator
}
