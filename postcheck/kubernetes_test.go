package postcheck

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// A Pending claim's row quotes the provisioner's failure, not the Normal
// "Provisioning" event its retry records after it (seen with the lab's
// root-squashed export: the retry's event was the newest).
func TestPendingClaimQuotesTheFailure(t *testing.T) {
	at := func(s int) metav1.Time { return metav1.NewTime(time.Date(2026, 11, 28, 20, 13, s, 0, time.UTC)) }
	event := func(name, typ, reason, msg string, last metav1.Time) *corev1.Event {
		return &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "nfs-provisioner"},
			InvolvedObject: corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: "nfs-provisioner", Name: "pc"},
			Type:           typ, Reason: reason, Message: msg, LastTimestamp: last}
	}
	c := &checker{o: Options{PVCNamespace: "nfs-provisioner"}}
	cs := fake.NewClientset(
		event("a", corev1.EventTypeNormal, "Provisioning", "External provisioner is provisioning volume", at(35)),
		event("b", corev1.EventTypeWarning, "ProvisioningFailed", "permission denied (NFS3ERR_ACCES)", at(34)))
	if got := c.pvcEvents(t.Context(), cs, "pc"); !strings.Contains(got, "ProvisioningFailed: permission denied") {
		t.Errorf("quoted %q, want the failure", got)
	}
	only := fake.NewClientset(event("a", corev1.EventTypeNormal, "Provisioning", "External provisioner is provisioning volume", at(35)))
	if got := c.pvcEvents(t.Context(), only, "pc"); !strings.Contains(got, "Provisioning: External provisioner") {
		t.Errorf("quoted %q, want the newest event", got)
	}
}
