package proxmox

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"

	pxapi "github.com/Telmate/proxmox-api-go/proxmox"

	"github.com/homelab/bootstrap/internal/retry"
)

// APIError is an error answer from the Proxmox API, with PVE's own message.
type APIError struct {
	Method string
	Path   string
	Status int
	// Message is PVE's text ("VM is locked (create)").
	Message string
	// Params are per-parameter errors of a 400 "Parameter verification failed".
	Params map[string]string
}

func (e *APIError) Error() string {
	msg := fmt.Sprintf("Proxmox API %s %s: %d %s", e.Method, e.Path, e.Status, e.Message)
	if path, privs, ok := e.MissingPrivilege(); ok {
		msg += fmt.Sprintf(" (the token needs %s on %s; precheck lists every missing privilege)", strings.Join(privs, " or "), path)
	}
	if len(e.Params) > 0 {
		keys := make([]string, 0, len(e.Params))
		for k := range e.Params {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = k + ": " + strings.TrimSpace(e.Params[k])
		}
		msg += " (" + strings.Join(parts, "; ") + ")"
	}
	return msg
}

// permText is PVE's 403 text naming what was missing: "Permission check
// failed (<path>, <priv>)", or "(<path>, <a>|<b>)" when any one of them
// would do (pve-common src/PVE/Exception.pm raise_perm_exc; pve-access-control
// 9.1.1 src/PVE/RPCEnvironment.pm check, check_any).
var permText = regexp.MustCompile(`^Permission check failed \((/[^,]*), ([^)]+)\)$`)

// MissingPrivilege returns the path and privileges a 403 answer names,
// exactly as PVE's message names them (any one of privs is enough). A
// privilege check PVE reports without a path (root@pam only, say) gives
// ok false.
func (e *APIError) MissingPrivilege() (path string, privs []string, ok bool) {
	if e.Status != 403 {
		return "", nil, false
	}
	m := permText.FindStringSubmatch(e.Message)
	if m == nil {
		return "", nil, false
	}
	return m[1], strings.Split(m[2], "|"), true
}

// TaskError is a Proxmox task that ended with an error exit status.
type TaskError struct {
	UPID       string
	What       string
	ExitStatus string
}

func (e *TaskError) Error() string {
	return fmt.Sprintf("%s failed: %s (task %s)", e.What, e.ExitStatus, e.UPID)
}

// lockText matches PVE's texts for a VM that is busy with something else;
// these clear by themselves, so they are retried: "VM is locked (…)"
// (qemu-server PVE::QemuConfig check_lock), "can't lock file '…' - got
// timeout" (pve-common PVE::Tools lock_file_full), "cfs-lock '…' error: got
// lock request timeout" (pve-cluster PVE::Cluster cfs_lock).
var lockText = regexp.MustCompile(`VM is locked|can't lock file|got timeout|cfs-lock .* timeout`)

// permanent500 matches 500 answers that describe a state, not a hiccup:
// PVE uses 500 for almost everything, and retrying these only delays the
// real message.
// Among them: a storage disabled or not on the node (pve-storage
// src/PVE/Storage.pm storage_check_enabled, storage_check_node) and a node
// name the cluster cannot resolve (pve-manager PVE/HTTPServer.pm proxying
// through pve-cluster remote_node_ip and pve-common get_ip_from_hostname).
var permanent500 = regexp.MustCompile(`is disabled|is not available on node|hostname lookup|address lookup for|unable to get remote IP address|already exists|does not exist|is running - destroy failed|not running|protection mode|only root|no such|not supported|does not support|not configured for content-type|not a file based storage|no options specified|detected modified configuration|refusing to override|Permission check failed`)

// IsLockError reports whether err is PVE saying the VM is locked or busy.
func IsLockError(err error) bool {
	var ae *APIError
	if errors.As(err, &ae) {
		return lockText.MatchString(ae.Message)
	}
	var te *TaskError
	if errors.As(err, &te) {
		return lockText.MatchString(te.ExitStatus)
	}
	return false
}

// IsNotFound reports whether err is PVE saying the VM (config) does not exist.
func IsNotFound(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && strings.Contains(ae.Message, "does not exist")
}

// IsAlreadyExists reports whether err is PVE refusing to create a VM whose VMID is taken.
func IsAlreadyExists(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && strings.Contains(ae.Message, "already exists")
}

// IsForbidden reports whether err is a 403 permission failure.
func IsForbidden(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == 403
}

// IsUnauthorized reports whether err is a 401 authentication failure.
func IsUnauthorized(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == 401
}

// transientStatus: a 5xx may clear by itself, except 501, PVE's answer to
// a path or method it has no handler for ("Method '…' not implemented",
// pve-http-server / pve-manager PVE/HTTPServer.pm).
func transientStatus(code int) bool { return code >= 500 && code != 501 }

// classify turns what Telmate returned for one call into our error, marked
// retryable at this boundary when it is transient: 5xx that are not a
// state description, PVE's lock texts, and network failures. 4xx answers
// and TLS verification failures are fatal.
func classify(method, path string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("Proxmox API %s %s: %w", method, path, err)
	}
	var pe *PinError
	var ue *UnknownAuthorityError
	var ce x509.CertificateInvalidError
	var he x509.HostnameError
	if errors.As(err, &pe) || errors.As(err, &ue) || errors.As(err, &ce) || errors.As(err, &he) {
		return fmt.Errorf("Proxmox API %s %s: %w", method, path, err)
	}
	var tae *pxapi.ApiError
	if errors.As(err, &tae) {
		ae := &APIError{Method: method, Path: path, Message: strings.TrimSpace(tae.Message)}
		ae.Status, _ = strconv.Atoi(tae.Code)
		if len(tae.Errors) > 0 {
			ae.Params = map[string]string{}
			for k, v := range tae.Errors {
				ae.Params[k] = strings.TrimSpace(fmt.Sprint(v))
			}
		}
		if ae.Status == 401 {
			return fmt.Errorf("%w: check the API token ID and secret (or user and password)", ae)
		}
		if lockText.MatchString(ae.Message) || (transientStatus(ae.Status) && !permanent500.MatchString(ae.Message)) {
			return retry.Retryable(ae)
		}
		return ae
	}
	// Telmate reports a non-JSON error answer as the bare status line.
	if m := regexp.MustCompile(`^(\d{3}) (.*)$`).FindStringSubmatch(err.Error()); m != nil {
		code, _ := strconv.Atoi(m[1])
		ae := &APIError{Method: method, Path: path, Status: code, Message: m[2]}
		if transientStatus(code) || lockText.MatchString(m[2]) {
			return retry.Retryable(ae)
		}
		return ae
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
		return fmt.Errorf("Proxmox API %s %s: %w", method, path, err)
	}
	var ne net.Error
	var oe *net.OpError
	if errors.As(err, &ne) || errors.As(err, &oe) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) {
		return retry.Retryable(fmt.Errorf("Proxmox API %s %s: %w", method, path, err))
	}
	return fmt.Errorf("Proxmox API %s %s: %w", method, path, err)
}
