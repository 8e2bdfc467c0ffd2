package kube

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"strings"
	"time"
)

// WritesAuditPolicy records every create, update, patch and delete (with
// its user, user agent and object, not its body) once the response is
// complete, and nothing else: enough to count who changed what.
const WritesAuditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted, Panic]
rules:
  - level: Metadata
    verbs: [create, update, patch, delete, deletecollection]
  - level: None
`

// AuditEvent is the part of a kube-apiserver audit event (audit.k8s.io/v1,
// one JSON object per line) that tells who wrote what.
type AuditEvent struct {
	Verb       string `json:"verb"`
	RequestURI string `json:"requestURI"`
	UserAgent  string `json:"userAgent"`
	User       struct {
		Username string   `json:"username"`
		Groups   []string `json:"groups"`
	} `json:"user"`
	ObjectRef struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
		APIGroup    string `json:"apiGroup"`
	} `json:"objectRef"`
	ResponseStatus struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	RequestReceivedTimestamp time.Time `json:"requestReceivedTimestamp"`
}

// DryRun reports whether the request was a server-side dry run
// (dryRun=All), which persists nothing.
func (e AuditEvent) DryRun() bool {
	u, err := url.Parse(e.RequestURI)
	if err != nil {
		return strings.Contains(e.RequestURI, "dryRun=All")
	}
	for _, v := range u.Query()["dryRun"] {
		if v == "All" {
			return true
		}
	}
	return false
}

// Object names the target as resource[/subresource] namespace/name.
func (e AuditEvent) Object() string {
	r := e.ObjectRef.Resource
	if e.ObjectRef.APIGroup != "" {
		r += "." + e.ObjectRef.APIGroup
	}
	if e.ObjectRef.Subresource != "" {
		r += "/" + e.ObjectRef.Subresource
	}
	name := e.ObjectRef.Name
	if e.ObjectRef.Namespace != "" {
		name = e.ObjectRef.Namespace + "/" + name
	}
	return r + " " + name
}

func (e AuditEvent) String() string {
	return fmt.Sprintf("%s %s by %s (%s) → %d", e.Verb, e.Object(), e.User.Username, e.UserAgent, e.ResponseStatus.Code)
}

// ReadAuditLog parses an audit log file; a missing file is an empty log.
// A last line without its newline (being written right now) is left out.
func ReadAuditLog(path string) ([]AuditEvent, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	lines := bytes.Split(b, []byte("\n"))
	lines = lines[:len(lines)-1]
	out := make([]AuditEvent, 0, len(lines))
	for i, l := range lines {
		if len(bytes.TrimSpace(l)) == 0 {
			continue
		}
		var ev AuditEvent
		if err := json.Unmarshal(l, &ev); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, i+1, err)
		}
		out = append(out, ev)
	}
	return out, nil
}
