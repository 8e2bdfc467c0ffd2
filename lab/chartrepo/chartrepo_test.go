package chartrepo_test

import (
	"io"
	"net/http"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/repo"
	"sigs.k8s.io/yaml"

	"github.com/homelab/bootstrap/lab/chartrepo"
)

// render installs the packaged lab chart client-side and returns its objects.
func render(t *testing.T, vals map[string]any) (map[string][]map[string]any, error) {
	t.Helper()
	dir := t.TempDir()
	charts, err := chartrepo.Package(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(charts) != 1 || charts[0] != (chartrepo.Chart{Name: "nfs-subdir-external-provisioner", Version: "4.0.18"}) {
		t.Fatalf("packaged %v, want the nfs-subdir-external-provisioner 4.0.18 stand-in", charts)
	}
	ch, err := loader.Load(dir + "/nfs-subdir-external-provisioner-4.0.18.tgz")
	if err != nil {
		t.Fatal(err)
	}
	inst := action.NewInstall(&action.Configuration{})
	inst.ClientOnly, inst.DryRun = true, true
	inst.ReleaseName, inst.Namespace = "nfs-provisioner", "storage"
	inst.KubeVersion = &chartutil.KubeVersion{Version: "v1.37.0", Major: "1", Minor: "37"}
	rel, err := inst.Run(ch, vals)
	if err != nil {
		return nil, err
	}
	objs := map[string][]map[string]any{}
	for _, doc := range strings.Split(rel.Manifest, "\n---") {
		var o map[string]any
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("rendered YAML does not parse: %v\n%s", err, doc)
		}
		if len(o) == 0 {
			continue
		}
		kind := o["kind"].(string)
		objs[kind] = append(objs[kind], o)
	}
	return objs, nil
}

func get(o map[string]any, path ...string) any {
	var cur any = o
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[p]
	}
	return cur
}

func TestChartRendersLikeUpstream(t *testing.T) {
	objs, err := render(t, map[string]any{
		"nfs": map[string]any{"server": "10.0.0.5", "path": "/export/k8s", "mountOptions": []any{"nfsvers=4.1"}},
		"storageClass": map[string]any{
			"defaultClass": true, "archiveOnDelete": false, "reclaimPolicy": "Retain",
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for k, v := range objs {
		for range v {
			kinds = append(kinds, k)
		}
	}
	sort.Strings(kinds)
	want := "ClusterRole ClusterRoleBinding Deployment PersistentVolume PersistentVolumeClaim Role RoleBinding ServiceAccount StorageClass"
	if strings.Join(kinds, " ") != want {
		t.Errorf("kinds %v, want %s", kinds, want)
	}
	sc := objs["StorageClass"][0]
	if got := get(sc, "provisioner"); got != "cluster.local/nfs-provisioner-nfs-subdir-external-provisioner" {
		t.Errorf("default provisioner name %v", got)
	}
	if get(sc, "metadata", "name") != "nfs-client" || get(sc, "reclaimPolicy") != "Retain" ||
		get(sc, "parameters", "archiveOnDelete") != "false" ||
		get(sc, "metadata", "annotations", "storageclass.kubernetes.io/is-default-class") != "true" {
		t.Errorf("StorageClass %v", sc)
	}
	if mo, _ := get(sc, "mountOptions").([]any); len(mo) != 1 || mo[0] != "nfsvers=4.1" {
		t.Errorf("StorageClass mountOptions %v", get(sc, "mountOptions"))
	}
	env := map[string]string{}
	containers := get(objs["Deployment"][0], "spec", "template", "spec", "containers").([]any)
	for _, e := range get(containers[0].(map[string]any), "env").([]any) {
		m := e.(map[string]any)
		env[m["name"].(string)] = m["value"].(string)
	}
	if env["PROVISIONER_NAME"] != get(sc, "provisioner") || env["NFS_SERVER"] != "10.0.0.5" || env["NFS_PATH"] != "/export/k8s" {
		t.Errorf("Deployment env %v", env)
	}
	if get(objs["Deployment"][0], "spec", "strategy", "type") != "Recreate" {
		t.Error("Deployment strategy is not Recreate")
	}
	if get(objs["Deployment"][0], "metadata", "labels", "app") != "nfs-subdir-external-provisioner" {
		t.Error("Deployment lacks the app label the stand-in selects on")
	}
	if get(objs["PersistentVolume"][0], "spec", "nfs", "server") != "10.0.0.5" {
		t.Errorf("root PV %v", objs["PersistentVolume"][0])
	}
	vols := get(objs["Deployment"][0], "spec", "template", "spec", "volumes").([]any)
	if get(vols[0].(map[string]any), "persistentVolumeClaim", "claimName") != "pvc-nfs-provisioner-nfs-subdir-external-provisioner" {
		t.Errorf("Deployment volume with mountOptions %v", vols[0])
	}

	// The provisioner name is pinned by a value, and nfs.server is required.
	objs, err = render(t, map[string]any{
		"nfs":          map[string]any{"server": "nas.lan"},
		"storageClass": map[string]any{"provisionerName": "homelab.local/nfs", "name": "nfs"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if get(objs["StorageClass"][0], "provisioner") != "homelab.local/nfs" || get(objs["StorageClass"][0], "metadata", "name") != "nfs" {
		t.Errorf("StorageClass %v", objs["StorageClass"][0])
	}
	// Without mount options, as upstream: no root PV/PVC pair; the pod
	// mounts the export itself (nothing waits on a claim to bind).
	if len(objs["PersistentVolume"])+len(objs["PersistentVolumeClaim"]) != 0 {
		t.Errorf("root PV/PVC rendered without mountOptions: %v %v", objs["PersistentVolume"], objs["PersistentVolumeClaim"])
	}
	vols = get(objs["Deployment"][0], "spec", "template", "spec", "volumes").([]any)
	if v := vols[0].(map[string]any); get(v, "nfs", "server") != "nas.lan" || v["persistentVolumeClaim"] != nil {
		t.Errorf("Deployment volume without mountOptions %v", v)
	}
	if _, err := render(t, map[string]any{}); err == nil || !strings.Contains(err.Error(), "nfs.server is required") {
		t.Errorf("render without nfs.server: %v", err)
	}
}

func TestRepoServesIndexAndChart(t *testing.T) {
	r, err := chartrepo.Start(chartrepo.Options{AlsoAs: map[string][]string{"nfs-subdir-external-provisioner": {"4.0.17"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	resp, err := http.Get(r.URL() + "/index.yaml")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var idx repo.IndexFile
	if err := yaml.Unmarshal(body, &idx); err != nil {
		t.Fatal(err)
	}
	cv, err := idx.Get("nfs-subdir-external-provisioner", "4.0.18")
	if err != nil {
		t.Fatalf("index: %v\n%s", err, body)
	}
	if len(cv.URLs) != 1 || !strings.HasPrefix(cv.URLs[0], r.URL()+"/") {
		t.Fatalf("chart URLs %v not on %s", cv.URLs, r.URL())
	}
	resp, err = http.Get(cv.URLs[0])
	if err != nil {
		t.Fatal(err)
	}
	tgz, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", cv.URLs[0], resp.Status)
	}
	ch, err := loader.LoadArchive(strings.NewReader(string(tgz)))
	if err != nil || ch.Metadata.Version != "4.0.18" {
		t.Fatalf("served archive: %v", err)
	}
	// The stand-in at the extra version: the same templates, its own version.
	old, err := idx.Get("nfs-subdir-external-provisioner", "4.0.17")
	if err != nil || len(old.URLs) != 1 {
		t.Fatalf("index has no 4.0.17 (AlsoAs): %v\n%s", err, body)
	}
	resp, err = http.Get(old.URLs[0])
	if err != nil {
		t.Fatal(err)
	}
	tgz, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	oldCh, err := loader.LoadArchive(strings.NewReader(string(tgz)))
	if err != nil || oldCh.Metadata.Version != "4.0.17" || len(oldCh.Templates) != len(ch.Templates) || len(oldCh.Templates) == 0 {
		t.Fatalf("served 4.0.17 archive: %v (version %v, %d templates vs %d)", err, oldCh.Metadata.Version, len(oldCh.Templates), len(ch.Templates))
	}
	if got := r.Charts(); len(got) != 2 || got[0].Version != "4.0.17" || got[1].Version != "4.0.18" {
		t.Errorf("Charts() = %v", got)
	}
	if r.Requests("/index.yaml") != 1 {
		t.Errorf("index requests %d", r.Requests("/index.yaml"))
	}
}
