package config

import (
	"errors"
	"fmt"
	"sort"
	"strings"
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
		return fmt.Sprintf("%s: %s%s", loc, kind, e.Msg)
	}
	return fmt.Sprintf("%s: %s%s: %s", loc, kind, e.Path, e.Msg)
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
