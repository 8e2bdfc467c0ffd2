package gitsnap

import (
	"fmt"
	"strings"
)

// Withheld is one file a snapshot leaves out: where it is and which rule
// left it out (never its content), and, when the cluster's build reads
// it, what reads it.
type Withheld struct {
	// Path is slash-separated, relative to the work tree's root.
	Path string `json:"path"`
	// Rule is one of the Rule* constants (or RuleTokenPrefix + a format).
	Rule string `json:"rule"`
	// NeededBy says what in the cluster's build reads the file ("listed in
	// infra/kustomization.yaml", "a file of the Helm chart charts/app/, …");
	// empty when nothing does.
	NeededBy string `json:"neededBy,omitempty"`
}

// String renders "infra/db.yaml (unencrypted Secret; listed in …)".
func (w Withheld) String() string {
	if w.NeededBy == "" {
		return fmt.Sprintf("%s (%s)", w.Path, w.Rule)
	}
	return fmt.Sprintf("%s (%s; %s)", w.Path, w.Rule, w.NeededBy)
}

// plaintextRule are the rules judging plaintext Secret values, which
// BuildOptions.ServePlaintext may override; the others guard credentials,
// keys and bootstrap's own files and always hold.
var plaintextRule = map[string]bool{RuleUnencryptedSecret: true, RuleSecretGenerator: true, RuleSecretsBundle: true, RuleDotEnv: true, RuleHelmValues: true}

// Advice says what to do about a withheld file the cluster's build reads.
func (w Withheld) Advice() string {
	switch {
	case w.Rule == RuleUnencryptedSecret:
		return "encrypt its values with SOPS (sops encrypt -i --encrypted-regex '^(data|stringData)$' " + w.Path + ") and turn on flux.decryption, or take them from a Secret through postBuild.substituteFrom; to serve it in plaintext as git holds it, list it in flux.localSnapshot.servePlaintext"
	case w.Rule == RuleSecretGenerator:
		return "move the generator's literal values into a SOPS-encrypted env file it reads (envs: [secret.sops.env]) or encrypt the file it reads with SOPS; to serve it in plaintext, list it in flux.localSnapshot.servePlaintext"
	case w.Rule == RuleSecretsBundle || w.Rule == RuleDotEnv:
		return "encrypt it with SOPS (sops encrypt -i " + w.Path + "); to serve it in plaintext, list it in flux.localSnapshot.servePlaintext"
	case w.Rule == RuleHelmValues:
		return "move the secret values into a SOPS-encrypted Secret the HelmRelease reads with spec.valuesFrom; to serve it in plaintext, list it in flux.localSnapshot.servePlaintext"
	case w.Rule == RuleFiltered:
		return "git add it, so the snapshot serves what git holds"
	case w.Rule == RuleConfiguredExclude:
		return "flux.localSnapshot.exclude leaves it out: drop the pattern, or the reference to it"
	case w.Rule == RuleTalosDir || w.Rule == RuleStateDir || w.Rule == RuleProtected:
		return "it is bootstrap's own state or a credential the config names: keep it out of what Flux builds"
	default:
		return "take the credential out of it (keep it SOPS-encrypted in a Secret): it is never served"
	}
}

// NeededWithheld returns the withheld files the cluster's build reads,
// except those the configuration itself excludes (a choice, not the
// guard's: they are named, not refused).
func (s *Snapshot) NeededWithheld() []Withheld {
	var out []Withheld
	for _, w := range s.Withheld {
		if w.NeededBy != "" && w.Rule != RuleConfiguredExclude {
			out = append(out, w)
		}
	}
	return out
}

// Refusal is the error of a snapshot that leaves out a file the cluster's
// build reads: served, Flux would apply something else than git declares
// (an object missing, or a kustomization that fails on a missing file),
// so it is not served at all. Nil when nothing needed is withheld.
func (s *Snapshot) Refusal() error {
	needed := s.NeededWithheld()
	if len(needed) == 0 && len(s.Missed) == 0 {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "the snapshot would leave out %d file(s) the cluster's build reads, so Flux would apply something else than git declares:", len(needed)+len(s.Missed))
	for _, w := range needed {
		fmt.Fprintf(&b, "\n  %s: %s", w, w.Advice())
	}
	for _, m := range s.Missed {
		fmt.Fprintf(&b, "\n  %s (read by kustomize building %s/; bootstrap's reading of what the build needs left it out): set flux.localSnapshot.serve to tree to serve every file, and report the layout", m.Path, m.ReadBy)
	}
	return &RefusalError{Files: needed, Missed: s.Missed, msg: b.String()}
}

// RefusalError is Refusal's error: the withheld files the build reads.
type RefusalError struct {
	// Missed are the files the proof's kustomize read that need-to-know
	// serving left out.
	Missed []Missed
	Files  []Withheld
	msg    string
}

func (e *RefusalError) Error() string { return e.msg }

// WithheldList renders the withheld files for a log line or a report row:
// "none", or each file with its rule, the ones the build reads marked.
func (s *Snapshot) WithheldList() string {
	if len(s.Withheld) == 0 {
		return "none"
	}
	parts := make([]string, len(s.Withheld))
	for i, w := range s.Withheld {
		parts[i] = w.String()
	}
	return strings.Join(parts, ", ")
}

// Scope says what the snapshot serves, for logs and checks: the files
// the cluster's build reads (and how many it left out), or the whole
// tree and why, and which builds kustomize could not prove.
func (s *Snapshot) Scope() string {
	var b strings.Builder
	if s.WholeTree != "" {
		fmt.Fprintf(&b, "whole tree (%s)", s.WholeTree)
	} else {
		fmt.Fprintf(&b, "what the cluster's build reads (%d files nothing reads left out)", s.Unread)
	}
	if s.Unproven != "" {
		fmt.Fprintf(&b, "; unproven: %s", s.Unproven)
	}
	return b.String()
}
