package talos

import (
	"errors"
	"strings"

	"github.com/hashicorp/go-multierror"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/validation"
)

// MetalMode is what `talosctl validate --mode metal` checks against:
// installed on disk, not in a container. config validate checks patches
// in it too.
type MetalMode struct{}

// String implements validation.RuntimeMode.
func (MetalMode) String() string { return "metal" }

// RequiresInstall implements validation.RuntimeMode.
func (MetalMode) RequiresInstall() bool { return true }

// InContainer implements validation.RuntimeMode.
func (MetalMode) InContainer() bool { return false }

// ValidationError is one failed check of one rendered config.
type ValidationError struct {
	// Subject is "node cp-1" or a template file name.
	Subject string
	Err     error
}

// Error implements error.
func (e ValidationError) Error() string { return e.Subject + ": " + e.Err.Error() }

// ValidationErrors collects every validation failure of a render.
type ValidationErrors []ValidationError

// Error lists every failure, one per line.
func (v ValidationErrors) Error() string {
	lines := make([]string, 0, len(v)+1)
	lines = append(lines, "rendered Talos configs are invalid for metal:")
	for _, e := range v {
		lines = append(lines, "  "+e.Error())
	}
	return strings.Join(lines, "\n")
}

// ValidateMetal checks a config the way a metal node will, strictly (a
// warning is an error: machinery's validation.WithStrict), returning one
// error per problem found. Metal requires the install section, which is
// what an ISO-booted node needs; the conflict between a v1alpha1 field and
// the typed document replacing it (Talos v1.14) is checked here too, by
// machinery's container validation (config/container/validate.go at
// v1.14.1: V1Alpha1ConflictValidate for every document).
func ValidateMetal(cfg config.Provider) (warnings []string, errs []error) {
	warnings, err := cfg.ValidateAsClient(MetalMode{}, validation.WithLocal(), validation.WithStrict())
	if err == nil {
		return warnings, nil
	}
	var merr *multierror.Error
	if errors.As(err, &merr) {
		return warnings, merr.Errors
	}
	return warnings, []error{err}
}

func validateMetal(subject string, cfg config.Provider) ValidationErrors {
	_, errs := ValidateMetal(cfg)
	out := make(ValidationErrors, 0, len(errs))
	for _, e := range errs {
		out = append(out, ValidationError{Subject: subject, Err: e})
	}
	return out
}
