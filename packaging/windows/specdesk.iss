; Inno Setup script: a per-user (or, when elevated, per-machine) installer of the one-folder
; bundle that packaging/specdesk.spec writes to dist\<flavour>\specdesk.
; packaging\windows\build_windows.ps1 builds the bundle and then runs:
;   iscc /DAppVersion=<version> /DFlavour=<gguf|full> packaging\windows\specdesk.iss
; The installer is written to dist\SpecDesk-<version>-windows-x64-<flavour>-setup.exe.

#ifndef AppVersion
  #define AppVersion "0.0.0"
#endif
#ifndef Flavour
  #define Flavour "gguf"
#endif
#define SourceRoot "..\.."

[Setup]
AppId={{6F3B1E52-8C47-4D1A-9E0B-5A2C7D4F8B13}
AppName=SpecDesk
AppVersion={#AppVersion}
AppVerName=SpecDesk {#AppVersion} ({#Flavour})
AppPublisher=SpecDesk
DefaultDirName={autopf}\SpecDesk
DefaultGroupName=SpecDesk
DisableProgramGroupPage=yes
UninstallDisplayIcon={app}\specdesk.exe
SetupIconFile={#SourceRoot}\packaging\icons\specdesk.ico
OutputDir={#SourceRoot}\dist
OutputBaseFilename=SpecDesk-{#AppVersion}-windows-x64-{#Flavour}-setup
Compression=lzma2/max
SolidCompression=yes
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
; No administrator rights needed; an elevated user may still choose all users.
PrivilegesRequired=lowest
PrivilegesRequiredOverridesAllowed=dialog
WizardStyle=modern

[Tasks]
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; GroupDescription: "{cm:AdditionalIcons}"; Flags: unchecked

[Files]
Source: "{#SourceRoot}\dist\{#Flavour}\specdesk\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{group}\SpecDesk"; Filename: "{app}\specdesk.exe"
Name: "{group}\Uninstall SpecDesk"; Filename: "{uninstallexe}"
Name: "{autodesktop}\SpecDesk"; Filename: "{app}\specdesk.exe"; Tasks: desktopicon

[Run]
Filename: "{app}\specdesk.exe"; Description: "{cm:LaunchProgram,SpecDesk}"; Flags: nowait postinstall skipifsilent
