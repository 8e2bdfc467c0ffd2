package config

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/homelab/bootstrap/internal/redact"
)

// UserError marks a failure caused by the user's input (config file, flags,
// environment): the CLI exits 2 and nothing was changed.
type UserError struct{ Err error }

func (e *UserError) Error() string { return e.Err.Error() }
func (e *UserError) Unwrap() error { return e.Err }

// Userf returns a UserError with a formatted message.
func Userf(format string, a ...any) error { return &UserError{Err: fmt.Errorf(format, a...)} }

// IsUserError reports whether err is (or wraps) a UserError or field errors.
func IsUserError(err error) bool {
	var u *UserError
	var fe *Errors
	return errors.As(err, &u) || errors.As(err, &fe)
}

// FieldError is one problem with one config field.
type FieldError struct {
	File string
	Line int
	Col  int
	// Path is the field path, e.g. nodes[1].ip.
	Path string
	Msg  string
	// Warning marks a problem that does not stop a run.
	Warning bool
}

// message formats a problem's text: every value it quotes (a string or
// an error) is masked as a value that was meant to be a name or
// a path (redact.Value), and the result by the shapes of secrets
// (redact.Text). The decoder and the validator build every message here,
// so a value quoted back from a new field is masked without anyone
// remembering it.
func message(format string, a ...any) string {
	args := make([]any, len(a))
	for i, x := range a {
		switch v := x.(type) {
		case string:
			args[i] = redact.Value(v)
		case error:
			args[i] = redact.Value(v.Error())
		default:
			args[i] = x
		}
	}
	return redact.Text(fmt.Sprintf(format, args...))
}

func (e *FieldError) Error() string {
	loc := e.File
	switch {
	case e.Line > 0 && e.Col > 0:
		loc = fmt.Sprintf("%s:%d:%d", e.File, e.Line, e.Col)
	case e.Line > 0:
		loc = fmt.Sprintf("%s:%d", e.File, e.Line)
	}
	kind := ""
	if e.Warning {
		kind = "warning: "
	}
	if e.Path == "" {
		return redact.Text(fmt.Sprintf("%s: %s%s", loc, kind, e.Msg))
	}
	// A path holds the keys of the user's maps (cluster.patches.nodes.<key>).
	return redact.Text(fmt.Sprintf("%s: %s%s: %s", loc, kind, redact.Value(e.Path), e.Msg))
}

// Errors collects every problem found in one config; it is an error only
// when at least one entry is not a warning.
type Errors struct {
	File  string
	Items []*FieldError
}

// Fatal returns the entries that are not warnings.
func (e *Errors) Fatal() []*FieldError {
	var out []*FieldError
	for _, it := range e.Items {
		if !it.Warning {
			out = append(out, it)
		}
	}
	return out
}

// Warnings returns the warning entries.
func (e *Errors) Warnings() []*FieldError {
	var out []*FieldError
	for _, it := range e.Items {
		if it.Warning {
			out = append(out, it)
		}
	}
	return out
}

func (e *Errors) Error() string {
	fatal := e.Fatal()
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d error(s) in the configuration:", e.File, len(fatal))
	for _, it := range fatal {
		b.WriteString("\n  ")
		b.WriteString(it.Error())
	}
	return b.String()
}

// sortItems orders problems by position in the file, then by path, so the
// output reads top to bottom and is stable for golden tests.
func (e *Errors) sortItems() {
	sort.SliceStable(e.Items, func(i, j int) bool {
		a, b := e.Items[i], e.Items[j]
		if (a.Line == 0) != (b.Line == 0) {
			return b.Line == 0
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		if a.Col != b.Col {
			return a.Col < b.Col
		}
		return a.Path < b.Path
	})
}
