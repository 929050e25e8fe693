# Builds the Windows installer of one flavour and self-tests the bundle:
#   dist\<flavour>\specdesk\                                   the one-folder bundle
#   dist\SpecDesk-<version>-windows-x64-<flavour>-setup.exe    the Inno Setup installer
#
#   powershell -File packaging\windows\build_windows.ps1 [-Flavour gguf|full] [-NoInstaller] [-NoSelftest]
#
# Needs the packaging extra (pip install -e ".[packaging]", plus ".[torch]" for full) and,
# for the installer, Inno Setup 6 (iscc on PATH or in its default folder; choco install innosetup).
# $env:PYTHON overrides the interpreter (default: .venv\Scripts\python.exe).
#
# Backend: the bundle carries the llama.cpp that the interpreter's llama-cpp-python was built
# with. Installers are built with CUDA 12 (scripts/llama_backend.py cmake-args cuda, plus
# GGML_CUDA_NO_VMM so it loads without an NVIDIA driver) and CPU code as run-time variants
# (ggml-cpu-*.dll, one per x86-64 level, the best loaded at start; never the build machine's
# own): .github/workflows/installers.yml. The self-test prints the backend and the variant.
param(
    [ValidateSet("gguf", "full")] [string] $Flavour = "gguf",
    [switch] $NoInstaller,
    [switch] $NoSelftest
)
$ErrorActionPreference = "Stop"
Set-Location (Join-Path $PSScriptRoot "..\..")

function Invoke-Checked([string] $What, [scriptblock] $Command) {
    & $Command
    if ($LASTEXITCODE -ne 0) { throw "build_windows: $What failed (exit code $LASTEXITCODE)" }
}

$Python = if ($env:PYTHON) { $env:PYTHON } else { ".venv\Scripts\python.exe" }
$version = & $Python -c "import tomllib; print(tomllib.load(open('pyproject.toml', 'rb'))['project']['version'])"
$bundle = "dist\$Flavour\specdesk"
$started = Get-Date

Write-Host "build_windows: building the $Flavour bundle with PyInstaller"
Invoke-Checked "PyInstaller" {
    & $Python -m PyInstaller --noconfirm --clean --log-level WARN `
        --workpath "build\pyinstaller-$Flavour" --distpath "dist\$Flavour" `
        packaging/specdesk.spec -- --flavour $Flavour
}
if ($Flavour -eq "gguf" -and (Test-Path "$bundle\_internal\torch")) {
    throw "build_windows: torch is in the GGUF-only bundle ($bundle\_internal\torch)"
}
# Folders of the build machine compiled into libraries: rewrite them, then prove none is left.
Invoke-Checked "scrubbing build paths" { & $Python packaging/bundle_paths.py scrub $bundle }
Invoke-Checked "the build-path check" { & $Python packaging/bundle_paths.py check $bundle }

$size = (Get-ChildItem $bundle -Recurse -File | Measure-Object -Property Length -Sum).Sum
Write-Host ("build_windows: {0} is {1:N0} MB unpacked ({2} bytes)" -f $bundle, ($size / 1e6), $size)

if (-not $NoSelftest) {
    # specdesk-cli.exe is the console twin of specdesk.exe (a windowed program has no stdout).
    $env:OMP_NUM_THREADS = "1"
    Invoke-Checked "the bundle's --selftest" { & "$bundle\specdesk-cli.exe" --selftest }
}

if (-not $NoInstaller) {
    $iscc = (Get-Command iscc.exe -ErrorAction SilentlyContinue).Source
    if (-not $iscc) { $iscc = "${env:ProgramFiles(x86)}\Inno Setup 6\ISCC.exe" }
    if (-not (Test-Path $iscc)) { throw "build_windows: Inno Setup 6 is missing: choco install innosetup" }
    Invoke-Checked "Inno Setup" { & $iscc "/DAppVersion=$version" "/DFlavour=$Flavour" packaging\windows\specdesk.iss }
    Write-Host "build_windows: dist\SpecDesk-$version-windows-x64-$Flavour-setup.exe"
}
Write-Host ("build_windows: done in {0:N0} s" -f ((Get-Date) - $started).TotalSeconds)
