package flux

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/ssa"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/yaml"

	"github.com/homelab/bootstrap/lab/kube"
	"github.com/homelab/bootstrap/lab/kube/kubetest"
)

// widgetCRD is the CRD of kind Widget in group: each test defines its own
// group, as the tests share one lab.
func widgetCRD(group string) string {
	return strings.ReplaceAll(widgetCRDTemplate, "GROUP", group)
}

const widgetCRDTemplate = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.GROUP
spec:
  group: GROUP
  names: {kind: Widget, listKind: WidgetList, plural: widgets, singular: widget}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer}
`

// labClient is a Client of the package's shared lab (fluxLab), with a
// minute's budget.
func labClient(t *testing.T) (*kube.Cluster, context.Context, *Client) {
	t.Helper()
	lab := fluxLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	c, err := NewClient(lab.RESTConfig(), kubetest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	return lab, ctx, c
}

// holdUntil is a client of the lab whose patches (applies and dry runs) of
// an object named name wait until called is closed, at most five
// seconds; *held says whether one was let go by it.
func holdUntil(t *testing.T, lab *kube.Cluster, c *Client, name string, called <-chan struct{}, held *bool) client.WithWatch {
	t.Helper()
	ww, err := client.NewWithWatch(lab.RESTConfig(), client.Options{Mapper: c.kube.RESTMapper()})
	if err != nil {
		t.Fatal(err)
	}
	return interceptor.NewClient(ww, interceptor.Funcs{Patch: func(ctx context.Context, cl client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
		if obj.GetName() == name {
			select {
			case <-called:
				*held = true
			case <-time.After(5 * time.Second):
			}
		}
		return cl.Patch(ctx, obj, patch, opts...)
	}})
}

// A CRD update goes one definition at a time only when it changes the
// CRD's spec, which makes the API server rebuild the kind's storage; one
// that changes only labels (a CRD another tool installed, adopted as it
// is) goes with the rest of the first stage at once. Custom resources wait
// only for the CRDs of their own kinds.
func TestOnlyACRDSpecChangeGoesOneByOne(t *testing.T) {
	_, ctx, c := labClient(t)
	const group = "crdspec.example.homelab"
	crd := func(edit func(*unstructured.Unstructured)) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(widgetCRD(group)), &u.Object); err != nil {
			t.Fatal(err)
		}
		if edit != nil {
			edit(u)
		}
		return u
	}
	plan := func(u *unstructured.Unstructured) []Change {
		t.Helper()
		changes, err := c.Plan(ctx, []*unstructured.Unstructured{u})
		if err != nil {
			t.Fatal(err)
		}
		return changes
	}

	first := plan(crd(nil))
	if len(first) != 1 || first[0].Action != "created" || definitionsOneByOne(first) {
		t.Fatalf("a new CRD: %+v, one by one %v", first, definitionsOneByOne(first))
	}
	if _, err := c.Apply(ctx, []*unstructured.Unstructured{crd(nil)}, time.Minute); err != nil {
		t.Fatal(err)
	}
	labelled := plan(crd(func(u *unstructured.Unstructured) {
		u.SetLabels(map[string]string{"app.kubernetes.io/part-of": "flux"})
	}))
	if len(labelled) != 1 || labelled[0].Action != "configured" || definitionsOneByOne(labelled) {
		t.Errorf("a label added: %+v, one by one %v (want configured, at once)", labelled, definitionsOneByOne(labelled))
	}
	widened := plan(crd(func(u *unstructured.Unstructured) {
		versions, _, _ := unstructured.NestedSlice(u.Object, "spec", "versions")
		v1 := versions[0].(map[string]any)
		if err := unstructured.SetNestedField(v1, map[string]any{"type": "string"},
			"schema", "openAPIV3Schema", "properties", "spec", "properties", "color"); err != nil {
			t.Fatal(err)
		}
		if err := unstructured.SetNestedSlice(u.Object, versions, "spec", "versions"); err != nil {
			t.Fatal(err)
		}
	}))
	if len(widened) != 1 || widened[0].Action != "configured" || !definitionsOneByOne(widened) {
		t.Errorf("a field added to the schema: %+v, one by one %v (want configured, one by one)", widened, definitionsOneByOne(widened))
	}

	// A custom resource applied with its new CRD waits for it to be
	// established (without the wait its apply fails: no match for the
	// kind), and the caller hears of it through DefinedKinds.
	gadgets := crd(func(u *unstructured.Unstructured) {
		u.SetName("gadgets." + group)
		if err := unstructured.SetNestedStringMap(u.Object, map[string]string{"kind": "Gadget", "listKind": "GadgetList", "plural": "gadgets", "singular": "gadget"}, "spec", "names"); err != nil {
			t.Fatal(err)
		}
	})
	gadget := &unstructured.Unstructured{Object: map[string]any{"apiVersion": group + "/v1", "kind": "Gadget",
		"metadata": map[string]any{"name": "g1", "namespace": "default"}, "spec": map[string]any{"size": int64(3)}}}
	changes := plan(gadgets)
	changes = append(changes, Change{Object: "Gadget/default/g1", Action: "created", obj: gadget})
	var told bool
	if _, err := c.ApplyChangesStaged(ctx, changes, time.Minute, DefinedKinds{Kinds: []schema.GroupKind{{Group: group, Kind: "Gadget"}}, Then: func(changed bool) { told = changed }}); err != nil {
		t.Fatalf("a CRD and a resource of its kind in one apply: %v", err)
	}
	if !told {
		t.Error("DefinedKinds.Then was not called, or not told the apply defined the kind")
	}
	got := &unstructured.Unstructured{}
	got.SetGroupVersionKind(gadget.GroupVersionKind())
	if err := c.kube.Get(ctx, client.ObjectKey{Namespace: "default", Name: "g1"}, got); err != nil {
		t.Errorf("the Gadget was not applied: %v", err)
	}
}

// DefinedKinds.Then goes as soon as its kinds' objects can be applied: once
// the namespace the apply creates exists and the CRD of its kind serves
// (here established before and only relabelled), not after the rest of
// the first stage: a ClusterRole whose apply is held until Then is called.
func TestDefinedKindsGoBesideTheRestOfTheDefinitions(t *testing.T) {
	lab, ctx, c := labClient(t)
	const group = "besidetherest.example.homelab"
	crd := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(widgetCRD(group)), &crd.Object); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Apply(ctx, []*unstructured.Unstructured{crd.DeepCopy()}, time.Minute); err != nil {
		t.Fatal(err)
	}
	crd.SetLabels(map[string]string{"app.kubernetes.io/part-of": "flux"})
	ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": "gizmos-beside"}}}
	held := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
		"metadata": map[string]any{"name": "held-beside"}, "rules": []any{}}}
	changes, err := c.Plan(ctx, []*unstructured.Unstructured{crd, ns, held})
	if err != nil {
		t.Fatal(err)
	}
	if len(changes) != 3 {
		t.Fatalf("plan: %+v, want the CRD configured, the namespace and the ClusterRole created", changes)
	}

	called := make(chan struct{})
	var heldUntilThen bool
	c.kube = holdUntil(t, lab, c, "held-beside", called, &heldUntilThen)
	var nsThere error
	var redefined bool
	then := func(changed bool) {
		redefined = changed
		nsThere = c.kube.Get(ctx, client.ObjectKey{Name: "gizmos-beside"}, ns.DeepCopy())
		close(called)
	}
	if _, err := c.ApplyChangesStaged(ctx, changes, time.Minute, DefinedKinds{Kinds: []schema.GroupKind{{Group: group, Kind: "Widget"}}, Then: then}); err != nil {
		t.Fatal(err)
	}
	if !heldUntilThen {
		t.Error("Then came only after every definition was applied, not once its kind's CRD served and its namespace existed")
	}
	if nsThere != nil {
		t.Errorf("Then came before the namespace the apply creates: %v", nsThere)
	}
	if redefined {
		t.Error("Then was told the kind was redefined by a change of labels")
	}
}

// PlanDefinedFirst tells the caller its kinds serve before the rest of the
// objects is planned when the CRD of the kind and the namespace are in
// place (here: the CRD relabelled, the namespace there): another
// object's dry run is held until Then is called. When the plan would
// create the CRD, Then is left to the apply, told the kind was defined.
func TestPlanDefinedFirstTellsBeforeTheRestIsPlanned(t *testing.T) {
	lab, ctx, c := labClient(t)
	const group = "planfirst.example.homelab"
	crd := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(widgetCRD(group)), &crd.Object); err != nil {
		t.Fatal(err)
	}
	ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": "gizmos-planfirst"}}}
	held := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
		"metadata": map[string]any{"name": "held-planfirst"}, "rules": []any{}}}
	if _, err := c.Apply(ctx, []*unstructured.Unstructured{crd.DeepCopy(), ns.DeepCopy(), held.DeepCopy()}, time.Minute); err != nil {
		t.Fatal(err)
	}
	crd.SetLabels(map[string]string{"app.kubernetes.io/part-of": "flux"})
	held.Object["rules"] = []any{map[string]any{"apiGroups": []any{""}, "resources": []any{"pods"}, "verbs": []any{"get"}}}
	widgets := DefinedKinds{Kinds: []schema.GroupKind{{Group: group, Kind: "Widget"}}}

	// The dry run of the held ClusterRole waits until Then is called (at
	// most five seconds): with Then after the whole plan, it never is.
	called := make(chan struct{})
	var heldUntilThen bool
	c.rm = ssa.NewResourceManager(holdUntil(t, lab, c, "held-planfirst", called, &heldUntilThen), nil, c.owner)
	var redefined bool
	widgets.Then = func(changed bool) {
		redefined = changed
		close(called)
	}
	changes, rest, err := c.PlanDefinedFirst(ctx, []*unstructured.Unstructured{held, crd, ns}, widgets)
	if err != nil {
		t.Fatal(err)
	}
	if !heldUntilThen {
		t.Error("Then came after the whole plan, not once the kind's CRD and the namespace were planned in place")
	}
	if redefined || rest.Then != nil {
		t.Errorf("Then told redefined=%v; Then left to the apply: %v (want false, none)", redefined, rest.Then != nil)
	}
	var got []string
	for _, ch := range changes {
		got = append(got, ch.Object+" "+ch.Action)
	}
	if want := []string{"ClusterRole/held-planfirst configured", "CustomResourceDefinition/widgets." + group + " configured"}; !slices.Equal(got, want) {
		t.Errorf("plan %q, want %q (the namespace unchanged)", got, want)
	}

	// A kind the plan would define: Then waits for the apply.
	gadgets := crd.DeepCopy()
	gadgets.SetName("gadgets." + group)
	if err := unstructured.SetNestedStringMap(gadgets.Object, map[string]string{"kind": "Gadget", "listKind": "GadgetList", "plural": "gadgets", "singular": "gadget"}, "spec", "names"); err != nil {
		t.Fatal(err)
	}
	early := false
	_, rest, err = c.PlanDefinedFirst(ctx, []*unstructured.Unstructured{gadgets, ns}, DefinedKinds{Kinds: []schema.GroupKind{{Group: group, Kind: "Gadget"}}, Then: func(bool) { early = true }})
	if err != nil {
		t.Fatal(err)
	}
	if early || rest.Then == nil {
		t.Errorf("a CRD the plan creates: Then called from the plan %v, left to the apply %v (want false, true)", early, rest.Then != nil)
	}
}
