package config

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/Masterminds/semver/v3"
	"github.com/homelab/bootstrap/internal/sealed"
	"github.com/homelab/bootstrap/sops"
)

// secrets checks the age recipients and the identity file: both are
// knowable from the config and the file it names, so a typo fails here and
// not halfway through the talos stage or a Kustomization an hour later.
func (v *validator) secrets() {
	a := v.c.Secrets.Age
	var recipients []string
	for i, r := range a.Recipients {
		path := fmt.Sprintf("secrets.age.recipients[%d]", i)
		if _, err := sealed.ParseRecipient(r); err != nil {
			v.notARecipient(path, r, err, "put the identity in a file named by secrets.age.keyFile")
			continue
		}
		recipients = append(recipients, strings.TrimSpace(r))
	}
	// The files derived from the bundle are sealed with age to all of
	// them at once, which age refuses for a mix of kinds.
	if _, err := sealed.ParseRecipients(recipients); errors.Is(err, sealed.ErrMixedRecipients) {
		v.errf("secrets.age.recipients", "%v (the configs, talosconfig and kubeconfig are age-encrypted to all of them together)", err)
	}
	// A .sops.yaml creation rule for the bundle's path decides how it is
	// encrypted (sops.FileSealer): one the tool cannot write fails here.
	var rule sops.CreationRule
	hasRule := false
	if len(recipients) > 0 {
		var err error
		if rule, hasRule, err = sops.RuleFor(v.c.Paths().Secrets); err != nil {
			v.errf("secrets.age.recipients", "the secrets bundle %s is governed by a .sops.yaml this tool cannot follow: %v", v.c.Paths().Secrets, err)
			return
		}
	}
	if a.KeyFile == "" {
		v.recipientsOpenHere(recipients)
		return
	}
	data, ok := v.secretFile("secrets.age.keyFile", a.KeyFile)
	if !ok {
		return
	}
	// Read as sops v3.13.2 reads it (sops.ParseIdentities): classic and
	// post-quantum identities.
	ids, err := sops.ParseIdentities(data, a.KeyFile)
	if err != nil {
		v.errf("secrets.age.keyFile", "%s holds no age identity (AGE-SECRET-KEY-1… or AGE-SECRET-KEY-PQ-1… lines, as age-keygen writes): %v", a.KeyFile, err)
		return
	}
	if v.c.Flux.Decryption.Enabled {
		v.pqIdentitiesNeedFlux(ids, "secrets.age.keyFile")
	}
	own := ids.Recipients
	if len(recipients) == 0 {
		return
	}
	if hasRule {
		opened, need := 0, rule.Options.GroupsNeeded()
		for _, g := range rule.Options.Groups {
			if slices.ContainsFunc(g, func(r string) bool { return slices.Contains(own, r) }) {
				opened++
			}
		}
		if opened < need {
			v.errf("secrets.age.keyFile", "%s decrypts %d of the key groups %s gives the secrets bundle, which needs %d: the bundle encrypted by that rule could not be read back; add %s to the rule or name a key file that opens it",
				a.KeyFile, opened, rule.Config, need, own[0])
		}
		return
	}
	for _, r := range recipients {
		for _, o := range own {
			if r == o {
				return
			}
		}
	}
	v.errf("secrets.age.keyFile", "%s decrypts for %s, none of secrets.age.recipients: the secrets bundle encrypted to them could not be read back; add %s to the recipients or name the matching key file",
		a.KeyFile, strings.Join(own, ", "), own[0])
}

// fluxDecryption needs an identity to hand to Flux: without
// secrets.age.keyFile it is looked up where the sops CLI reads identities,
// and finding none there fails now rather than in the flux stage. A
// post-quantum identity needs a Flux whose kustomize-controller reads it
// (pqFluxFloor).
func (v *validator) fluxDecryption() {
	if !v.c.Flux.Decryption.Enabled {
		return
	}
	var env LookupEnv
	if v.c.src != nil {
		env = v.c.src.env
	}
	if v.c.Secrets.Age.KeyFile != "" {
		// The key file is read and judged by the age checks.
		return
	}
	ids, err := sops.LoadIdentities("", env)
	if err == nil {
		v.pqIdentitiesNeedFlux(ids, "flux.decryption.enabled")
		return
	}
	lookup := env
	if lookup == nil {
		lookup = os.LookupEnv
	}
	if cmd, ok := lookup(sops.KeyCmdEnv); ok && cmd != "" {
		// sops v3.13.2 runs the key command for each recipient it
		// decrypts ($SOPS_AGE_RECIPIENT set): one that answers only
		// then is proven by the flux stage's precheck, which knows
		// the repository's recipients.
		v.warnf("flux.decryption.enabled", "$%s gave no age identity without $%s; the sops decryption precheck asks it for each recipient of the repository's SOPS files", sops.KeyCmdEnv, sops.RecipientEnv)
		return
	}
	// Where it looked, not the error: the user config directory
	// differs per machine and the message must not.
	v.errf("flux.decryption.enabled", "needs an age identity to hand to Flux and finds none where the sops CLI looks ($%s, $%s, $%s, <user config dir>/%s): set secrets.age.keyFile, or one of those", sops.KeyEnv, sops.KeyFileEnv, sops.KeyCmdEnv, sops.UserConfigPath)
}

// pqFluxFloor is the first Flux whose kustomize-controller reads
// post-quantum age identities (AGE-SECRET-KEY-PQ-1…): sops parses them
// from v3.12.0 (getsops/sops v3.13.2 age/keysource.go parseIdentity's
// "AGE-SECRET-KEY-PQ-1" case; v3.11.0's knows only AGE-PLUGIN- and
// AGE-SECRET-KEY-1, "unknown identity type"); kustomize-controller v1.8.5
// pins sops v3.11.0, v1.9.0 first pins sops v3.13 with age v1.3.1 (its
// go.mod; v1.9.5's: sops v3.13.2, age v1.3.1), and flux2 v2.9.0 first
// ships that controller (manifests/bases/kustomize-controller). An older
// kustomize-controller fails the import of the whole sops-age Secret
// (internal/decryptor/decryptor.go ImportKeys), classic keys included.
var pqFluxFloor = semver.MustParse("2.9.0")

// pqIdentitiesNeedFlux refuses a post-quantum identity for Flux older
// than pqFluxFloor.
func (v *validator) pqIdentitiesNeedFlux(ids sops.Identities, field string) {
	fv, err := semver.StrictNewVersion(strings.TrimPrefix(v.c.Flux.Version, "v"))
	if err != nil || !fv.LessThan(pqFluxFloor) {
		return
	}
	for _, r := range ids.Recipients {
		if strings.HasPrefix(r, "age1pq1") {
			v.errf(field, "%s holds a post-quantum age identity (AGE-SECRET-KEY-PQ-1…) that flux.version %s cannot read: its kustomize-controller's sops predates v3.12 and fails the whole sops-age Secret; set flux.version to v%s or later, or hand Flux classic identities only", ids.Source, v.c.Flux.Version, pqFluxFloor)
			return
		}
	}
}

// notARecipient refuses a value that is not an age public key. An
// identity (AGE-SECRET-KEY-1…, or -PQ-1…, in either case: bech32 allows
// lower case) is a secret typed where its public key belongs: the message
// says so without quoting it, and where the identity goes instead.
func (v *validator) notARecipient(path, r string, err error, identityGoes string) {
	if strings.HasPrefix(strings.ToUpper(strings.TrimSpace(r)), "AGE-SECRET-KEY-") {
		v.errf(path, "is an age identity, a secret: put its public key here (age1…, or age1pq1… for a post-quantum one: `age-keygen -y` prints it) and %s", identityGoes)
		return
	}
	v.errf(path, "%q is not an age public key (age1…, or age1pq1… from age-keygen -pq): %v", r, err)
}
